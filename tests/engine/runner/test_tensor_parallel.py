"""Tensor parallelism end to end: N=2 worker processes on this CPU (gloo).

Greedy output with N=2 equals N=1 in float32 on random models with GQA, MHA and fewer KV heads
than ranks (replicated), under both batching modes, both KV layouts, prefix caching and chunked
prefill, and with speculative decoding (n-gram, draft model). A worker killed or stopped
mid-generation fails the waiting callers within seconds; after `close()` no worker process or
listening port is left, also when the engine's process is killed or interrupted. Bad sizes are
refused with one clear message. Starting workers costs seconds, so each engine here serves
several checks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine import ConfigError, Engine, EngineConfig, SamplingParams, estimate_memory, unavailable_reason
from engine.config import tensor_parallel_reason
from engine.host import cpu_cores
from engine.runner.worker_gang import HEARTBEAT_TIMEOUT
from engine.testing import EngineProbe
from tests.support.child_scripts import CTRL_C_AS_IN_A_TERMINAL
from tests.support.paths import PROJECT_ROOT
from tests.support.worker_processes import (
    GREEDY,
    PROMPTS,
    all_gone,
    children,
    describe,
    gone,
    greedy,
    listening_ports,
    results_within,
    wait_until,
)

pytestmark = pytest.mark.skipif(cpu_cores() < 2, reason="two ranks need two CPU cores")


def reference(folder: str, **settings) -> list[list[int]]:
    with Engine(EngineConfig(model=folder, dtype="float32", **settings)) as engine:
        return greedy(engine)


# ---- equality: N=2 equals N=1 ---------------------------------------------------------------------

PAGED = dict(prefix_caching=True, block_size=4, max_num_batched_tokens=16, kv_cache_bytes=2**20)
STATIC_CONTIGUOUS = dict(batching="static", kv_layout="contiguous", prefix_caching=False, max_num_seqs=3)


@pytest.fixture(scope="module")
def gqa_engines(tiny_model_dirs):
    """N=1 and N=2 engines on the GQA model (paged KV, prefix caching, chunked prefill), after the same work."""
    config = EngineConfig(model=tiny_model_dirs["llama-gqa"], dtype="float32", **PAGED)
    engines, outputs = {}, {}
    try:
        for size in (1, 2):
            engines[size] = Engine(config.replace(tensor_parallel_size=size))
            outputs[size] = greedy(engines[size])
        yield config, engines, outputs
    finally:
        for engine in engines.values():
            engine.close()


def test_gqa_two_ranks_equal_one_with_prefix_caching_and_chunked_prefill(gqa_engines):
    _, engines, outputs = gqa_engines
    assert outputs[2] == outputs[1]
    stats = engines[2].stats()
    assert stats.prefix_cache_hit_rate > 0
    assert stats.kv_blocks_free == stats.kv_blocks_total


def test_gqa_two_ranks_equal_one_static_contiguous(tiny_model_dirs):
    folder = tiny_model_dirs["llama-gqa"]
    with Engine(EngineConfig(model=folder, dtype="float32", tensor_parallel_size=2, **STATIC_CONTIGUOUS)) as engine:
        assert greedy(engine) == reference(folder, **STATIC_CONTIGUOUS)


@pytest.mark.parametrize("arch", ["llama3-rope-scaling", "llama-mqa-tied"])
def test_mha_and_replicated_kv_two_ranks_equal_one(arch, tiny_model_dirs):
    """MHA splits 4 KV heads 2 + 2; MQA's single KV head is replicated on both ranks."""
    folder = tiny_model_dirs[arch]
    with Engine(EngineConfig(model=folder, dtype="float32", tensor_parallel_size=2)) as engine:
        assert greedy(engine) == reference(folder)


# ---- figures ----------------------------------------------------------------------------------------

def test_stats_show_each_rank_and_the_collectives(gqa_engines):
    _, engines, _ = gqa_engines
    one = engines[1].stats()
    assert one.tensor_parallel_size == 1 and one.rank_pids == (os.getpid(),)
    assert one.collective_seconds == 0 and one.collective_share == 0
    # ranks other than 0 report with their heartbeats, twice a second
    assert wait_until(lambda: all(s > 0 for s in engines[2].stats().rank_collective_seconds), 2)
    two = engines[2].stats()
    assert two.tensor_parallel_size == 2
    assert len(two.rank_weights_bytes) == len(two.rank_kv_cache_bytes) == len(two.rank_pids) == 2
    assert os.getpid() not in two.rank_pids
    assert two.rank_threads == (max(1, torch.get_num_threads() // 2),) * 2  # the cores are shared out
    # Each rank holds about half the weights (norms are replicated) and exactly half the KV heads.
    for weights in two.rank_weights_bytes:
        assert one.weights_bytes / 2 <= weights < one.weights_bytes * 0.51
    assert two.rank_kv_cache_bytes == (one.kv_cache_bytes // 2,) * 2
    assert two.kv_blocks_total == one.kv_blocks_total
    assert two.collective_seconds == two.rank_collective_seconds[0] > 0
    assert 0 < two.collective_share < 1


def test_estimate_matches_each_rank(gqa_engines):
    config, engines, _ = gqa_engines
    estimate = estimate_memory(config.replace(tensor_parallel_size=2))
    stats = engines[2].stats()
    assert estimate.rank_weights_bytes == stats.rank_weights_bytes
    assert estimate.rank_kv_cache_bytes == stats.rank_kv_cache_bytes
    assert estimate.total_bytes == stats.weights_bytes + stats.kv_cache_bytes


def test_replicated_kv_heads_cost_blocks(tiny_model_dirs):
    """With one KV head on each of two ranks, a block costs twice the bytes: the same budget holds half the blocks."""
    config = EngineConfig(model=tiny_model_dirs["llama-mqa-tied"], dtype="float32", kv_cache_bytes=2**20)
    one = estimate_memory(config)
    two = estimate_memory(config.replace(tensor_parallel_size=2))
    assert two.rank_kv_cache_bytes == (one.kv_cache_bytes // 2,) * 2


# ---- faults and clean-up ----------------------------------------------------------------------------

def start_long_requests(engine: Engine, count: int = 3):
    handles = [engine.submit([7 + i, 8, 9], SamplingParams(max_tokens=480, ignore_eos=True)) for i in range(count)]
    stream = iter(handles[0])
    for _ in range(3):  # generation is under way
        next(stream)
    return handles


def a_late_monitor(engine: Engine, monkeypatch) -> None:
    """From now on the executor's monitor thread looks at the workers only after rank 0 has exited, as a monitor
    not scheduled for a while on a loaded machine would: rank 1's death and rank 0's own report of the collective
    it broke ("Connection reset by peer") then reach it together, and it must still blame rank 1."""
    from engine.runner import worker_gang

    processes = EngineProbe(engine).rank_processes()
    real_wait = worker_gang.connection.wait
    late = threading.Event()

    def late_wait(objects, timeout=None):
        if threading.current_thread().name == "worker-monitor":
            late.set()
            real_wait([processes[0].sentinel], 30)
            timeout = 0
        return real_wait(objects, timeout)

    monkeypatch.setattr(worker_gang, "connection", SimpleNamespace(wait=late_wait))
    assert late.wait(5), "the monitor did not look again"


def lose_a_worker(engine: Engine, fault: str) -> None:
    """Kill or stop rank 1 mid-generation: the callers fail within seconds, and later requests fail at once."""
    pids = engine.stats().rank_pids
    handles = start_long_requests(engine)
    started = time.monotonic()
    os.kill(pids[1], signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
    outputs = results_within(handles, HEARTBEAT_TIMEOUT + 10)
    elapsed = time.monotonic() - started
    assert all(o.finish_reason == "error" for o in outputs)
    expected = "killed by SIGKILL" if fault == "killed" else "no heartbeat"
    assert all(f"rank 1 (pid {pids[1]})" in o.error and expected in o.error for o in outputs), outputs[0].error
    assert elapsed < (2 if fault == "killed" else HEARTBEAT_TIMEOUT + 3)
    late = engine.generate([1, 2, 3], GREEDY)[0]
    assert late.finish_reason == "error" and "build a new one" in late.error
    assert any("model steps fail" in note for note in engine.stats().notes)


def test_a_lost_worker_fails_callers_fast_and_close_frees_everything(tiny_model_dirs, monkeypatch):
    """A killed worker, then (on a new engine built afterwards) a stopped one; nothing is left behind either time.
    The kill is seen by a late monitor (`a_late_monitor`), which used to blame rank 0's connection error."""
    folder = tiny_model_dirs["llama-gqa"]
    before_children, before_ports = children(), listening_ports()
    for fault in ("killed", "stopped"):
        engine = Engine(EngineConfig(model=folder, dtype="float32", tensor_parallel_size=2))
        pids = engine.stats().rank_pids
        try:
            assert set(pids) <= children() - before_children
            assert greedy(engine, PROMPTS[:2]) == reference(folder)[:2]
            with monkeypatch.context() as patch:
                if fault == "killed":
                    a_late_monitor(engine, patch)
                lose_a_worker(engine, fault)
        except BaseException:  # the engine did not notice: end its workers so the failure cannot hang the suite
            for pid in pids:
                if not gone(pid):
                    os.kill(pid, signal.SIGKILL)
            engine.close()
            raise
        engine.close()
        assert wait_until(all_gone(pids), 5)
        assert children() <= before_children
        assert listening_ports() <= before_ports


PARENT = CTRL_C_AS_IN_A_TERMINAL + """
import json, sys, time
from engine import Engine, EngineConfig, SamplingParams
engine = Engine(EngineConfig(model=sys.argv[1], dtype="float32", tensor_parallel_size=2))
print(json.dumps(engine.stats().rank_pids), flush=True)
engine.generate([1, 2, 3], SamplingParams(max_tokens=400, ignore_eos=True))
time.sleep(600)
"""


# An interrupted parent's own exit is Python's interpreter teardown (full garbage collections and module clearing
# over torch's and transformers' objects): CPU-bound, 1-3 s on an idle machine and 4-14 s at a load of 6-9 on two
# cores, so it gets a generous bound; its workers must be gone within seconds whatever it takes.
PARENT_EXIT_SECONDS = 120


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_workers_die_with_their_parent(how, tiny_model_dirs):
    """Killed (no clean-up runs) or interrupted (Ctrl-C) mid-generation, the engine's process takes its
    workers along: killed, they see their parent gone; interrupted, its exit terminates them before its teardown."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, tiny_model_dirs["llama-gqa"]], stdout=subprocess.PIPE,
                              cwd=PROJECT_ROOT, text=True)
    try:
        pids = json.loads(parent.stdout.readline())
        assert len(pids) == 2 and all(not gone(pid) for pid in pids)
        time.sleep(0.5)
        parent.send_signal(how)
        assert wait_until(all_gone(pids), 10), f"the workers outlived their parent: {describe(parent.pid, *pids)}"
        parent.wait(PARENT_EXIT_SECONDS)
    finally:
        parent.kill()
        parent.wait()


# ---- bad values ---------------------------------------------------------------------------------------

def save_llama(folder, heads: int, kv_heads: int) -> str:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=12 * heads, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


def test_zero_ranks_is_refused():
    with pytest.raises(ConfigError, match="tensor_parallel_size must be a positive integer, got 0"):
        EngineConfig(tensor_parallel_size=0).validate()
    assert "positive" in unavailable_reason("tensor_parallel_size", 0)


@pytest.mark.parametrize(("heads", "kv_heads", "message"), [
    (3, 3, "3 attention heads do not divide over 2"),
    (6, 3, "3 KV heads do not divide over 2"),
])
def test_heads_that_do_not_split_are_refused_before_any_worker_starts(heads, kv_heads, message, tmp_path):
    folder = save_llama(tmp_path, heads, kv_heads)
    before = children()
    with pytest.raises(ConfigError, match=f"tensor_parallel_size=2: .*{message}"):
        Engine(EngineConfig(model=folder, dtype="float32", tensor_parallel_size=2))
    assert children() <= before


def test_more_ranks_than_devices_are_refused():
    too_many = cpu_cores() + 1
    reason = unavailable_reason("tensor_parallel_size", too_many, "cpu")
    assert f"{too_many} CPU cores" in reason
    with pytest.raises(ConfigError, match="CPU cores"):
        EngineConfig(device="cpu", tensor_parallel_size=too_many).validate()
    gpus = torch.cuda.device_count()
    assert f"{gpus} visible" in tensor_parallel_reason(max(2, gpus + 1), "cuda")
    assert unavailable_reason("tensor_parallel_size", 2, "cpu") is None


@pytest.mark.gpu
def test_more_ranks_than_gpus_are_refused_on_cuda():
    with pytest.raises(ConfigError, match="CUDA devices"):
        EngineConfig(device="cuda", tensor_parallel_size=torch.cuda.device_count() + 1).validate()


def test_the_hf_backend_is_refused():
    with pytest.raises(ConfigError, match="hf backend"):
        EngineConfig(backend="hf", tensor_parallel_size=2).validate()


# ---- speculative decoding on two ranks -----------------------------------------------------------------

QUESTION = [{"role": "user", "content": "How do I sort a list?"}]


@pytest.fixture(scope="module")
def demo_chats_and_greedy() -> tuple[list[list[dict]], list[list[int]]]:
    """A question, and a follow-up that asks it again after the model's own reply: the second answer repeats the
    first, so prompt lookup has something to propose whatever the bundled model says. Greedy ids from N=1."""
    with Engine(EngineConfig(model="demo", dtype="float32")) as engine:
        reply = engine.generate([QUESTION], SamplingParams(max_tokens=40))[0].text
        chats = [QUESTION, [*QUESTION, {"role": "assistant", "content": reply}, *QUESTION]]
        return chats, [o.token_ids for o in engine.generate(chats, SamplingParams(max_tokens=40))]


@pytest.mark.parametrize("speculative", ["ngram", "draft"])
def test_speculative_decoding_verifies_on_two_ranks(speculative, demo_chats_and_greedy):
    """The proposer (and a draft model) run in the engine's process; the ranks score the proposals. Greedy output
    equals plain N=1 greedy, proposals were made and some accepted, and memory adds up as estimated."""
    chats, greedy = demo_chats_and_greedy
    config = EngineConfig(model="demo", dtype="float32", tensor_parallel_size=2, speculative=speculative)
    with Engine(config) as engine:
        assert [o.token_ids for o in engine.generate(chats, SamplingParams(max_tokens=40))] == greedy
        stats = engine.stats()
    assert stats.spec_num_draft_tokens > 0
    assert stats.spec_num_accepted_tokens > 0
    estimate = estimate_memory(config)
    assert estimate.weights_bytes == stats.weights_bytes
    assert estimate.kv_cache_bytes == stats.kv_cache_bytes
    assert estimate.rank_weights_bytes == stats.rank_weights_bytes


# ---- the parent's main guard ----------------------------------------------------------------------

UNGUARDED = """import sys
from engine import Engine, EngineConfig
engine = Engine(EngineConfig(model=sys.argv[1], dtype="float32", tensor_parallel_size=2))
"""
WHERE_THE_MAIN_THREAD_IS = """import json, threading
from engine.runner.main_guard import unguarded_main_line
top = unguarded_main_line()
def nested(): return unguarded_main_line()
via_a_function = nested()
found = []
helper = threading.Thread(target=lambda: found.append(unguarded_main_line()))
helper.start(); helper.join()
if __name__ == "__main__":
    print(json.dumps([top, via_a_function, found[0], unguarded_main_line()]))
"""


def run_script(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(source)
    return subprocess.run([sys.executable, str(script), *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, timeout=300)


def test_a_script_without_a_main_guard_is_told_the_cause_and_the_fix(tiny_model_dirs, tmp_path):
    """Spawn runs the parent's script again in each worker; without the guard the worker would build an engine of
    its own and die with "rank 1 exited (exit code 1)". The engine names the script, the line and the fix."""
    run = run_script(tmp_path, UNGUARDED, tiny_model_dirs["llama-gqa"])
    assert run.returncode != 0
    assert 'under `if __name__ == "__main__":`' in run.stderr and "script.py" in run.stderr, run.stderr[-2000:]
    assert "(line 3)" in run.stderr and "exit code" not in run.stderr


def test_the_guard_check_follows_the_main_thread(tmp_path):
    """Unguarded: a top-level statement, a function it calls, another thread while the main thread is at the top
    level; guarded: inside `if __name__ == "__main__":`; `python -c` (spawn runs nothing again): never."""
    run = run_script(tmp_path, WHERE_THE_MAIN_THREAD_IS)
    script = str(tmp_path / "script.py")
    assert json.loads(run.stdout) == [[script, 3], [script, 5], [script, 8], None], run.stderr[-2000:]
    inline = subprocess.run([sys.executable, "-c", "from engine.runner.main_guard import unguarded_main_line\n"
                             "print(unguarded_main_line())"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                            timeout=300)
    assert inline.stdout.strip() == "None", inline.stderr[-2000:]
