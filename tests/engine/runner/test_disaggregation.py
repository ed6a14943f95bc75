"""Disaggregation (prefill-decode) end to end: a prefill worker and a decode worker on this CPU (gloo).

Greedy output disaggregated equals one process in float32 (GQA and MHA; prefix caching with a
shared prefix, chunked prefill, a prompt longer than the batched-token budget, concurrent requests
of different lengths, a conversation's next turn, preemption on a tiny decode pool); the decode
worker never runs a prompt chunk; every moved block is counted with its bytes; cancelling mid-prefill
or mid-decode leaves no block held on either side; a lost worker fails its callers within seconds,
named, and nothing is left behind, also when a script ends without `close()`; other settings it
does not combine with are refused with one message. Starting workers costs seconds, so each engine
here serves several checks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from engine import ConfigError, Engine, EngineConfig, SamplingParams, estimate_memory
from engine.host import cpu_cores
from engine.runner.worker_gang import HEARTBEAT_TIMEOUT
from engine.testing import EngineProbe
from tests.support.paths import PROJECT_ROOT
from tests.support.tiny_models import VOCAB
from tests.support.worker_processes import (
    GREEDY,
    PROMPTS,
    all_gone,
    children,
    close_and_check_nothing_left,
    describe,
    greedy,
    listening_ports,
    results_within,
    wait_until,
)

pytestmark = pytest.mark.skipif(cpu_cores() < 2, reason="two workers need two CPU cores")

DISAGG = dict(disaggregation="prefill-decode")
PAGED = dict(prefix_caching=True, block_size=4, max_num_batched_tokens=16, kv_cache_bytes=2**20)


def held_blocks(engine: Engine) -> tuple[int, int]:
    """Block tables held on the prefill side and on the decode side."""
    return EngineProbe(engine).on_loop(lambda b: (len(b.prefill_blocks.tables), len(b.decode_blocks.tables)))


def next_turn(prompt: list[int], reply: list[int]) -> list[int]:
    return prompt + reply + [11, 12, 13, 14, 15]


@pytest.fixture(scope="module")
def gqa(tiny_model_dirs):
    """Off and on engines on the GQA model after the same work (the prompts, then each one's next turn), with the
    disaggregated engine's figures right after the first round."""
    config = EngineConfig(model=tiny_model_dirs["llama-gqa"], dtype="float32", **PAGED)
    engines, outputs, turns = {}, {}, {}
    try:
        for mode in ("off", "prefill-decode"):
            engines[mode] = Engine(config.replace(disaggregation=mode))
            outputs[mode] = greedy(engines[mode])
            if mode != "off":
                first_stats = engines[mode].stats()
            second = [next_turn(p, o) for p, o in zip(PROMPTS, outputs[mode], strict=True)]
            turns[mode] = engines[mode].generate(second, GREEDY)
        yield config, engines, outputs, turns, first_stats
    finally:
        for engine in engines.values():
            engine.close()


def test_greedy_output_equals_one_process(gqa):
    _, engines, outputs, turns, _ = gqa
    assert outputs["prefill-decode"] == outputs["off"]
    assert [t.token_ids for t in turns["prefill-decode"]] == [t.token_ids for t in turns["off"]]
    stats = engines["prefill-decode"].stats()
    assert stats.prefix_cache_hit_rate > 0
    assert stats.kv_blocks_free == stats.kv_blocks_total
    assert held_blocks(engines["prefill-decode"]) == (0, 0)


def test_the_memory_estimate_counts_both_workers(gqa):
    """Two whole models and two pools: the estimate before loading matches each worker's bytes and their sum."""
    config, engines, _, _, _ = gqa
    estimate = estimate_memory(config.replace(disaggregation="prefill-decode"))
    stats = engines["prefill-decode"].stats()
    assert estimate.rank_weights_bytes == stats.rank_weights_bytes and len(stats.rank_weights_bytes) == 2
    assert estimate.rank_kv_cache_bytes == stats.rank_kv_cache_bytes
    assert estimate.total_bytes == stats.weights_bytes + stats.kv_cache_bytes
    assert estimate.weights_bytes == 2 * estimate_memory(config).weights_bytes


def test_seeded_sampling_and_logprobs_equal_one_process(gqa):
    """Sampling happens in the engine's process from either worker's logits: seeded draws and logprobs match."""
    _, engines, _, _, _ = gqa
    params = SamplingParams(max_tokens=8, temperature=0.9, top_k=20, seed=5, logprobs=3, ignore_eos=True)
    results = {mode: engine.generate(PROMPTS[:3], params) for mode, engine in engines.items()}
    off, on = results["off"], results["prefill-decode"]
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    for a, b in zip(on, off, strict=True):
        assert [t.logprob for t in a.logprobs] == pytest.approx([t.logprob for t in b.logprobs], abs=1e-4)


def test_next_turn_hits_only_the_previous_prompt_on_the_prefill_side(gqa):
    """The previous reply's K/V lives on the decode side: the prefill side finds the earlier prompt's full blocks."""
    _, _, _, turns, _ = gqa
    for prompt, turn in zip(PROMPTS, turns["prefill-decode"], strict=True):
        assert turn.metrics.cached_tokens == len(prompt) // 4 * 4


def test_the_decode_worker_never_runs_a_prompt_chunk(gqa):
    _, _, _, _, stats = gqa
    assert stats.worker_roles == ("prefill worker", "decode worker")
    assert stats.worker_prefill_chunks[0] > 0 and stats.worker_prefill_chunks[1] == 0
    assert stats.worker_decode_rows[1] >= len(PROMPTS) * 8
    assert all(0 < u <= 1 for u in stats.worker_utilisation)
    assert all(b > 0 for b in stats.worker_busy_seconds)
    assert len(set(stats.rank_pids)) == 2 and os.getpid() not in stats.rank_pids


def test_transfers_count_every_block_and_its_bytes(gqa):
    config, engines, _, _, stats = gqa
    plan = engines["prefill-decode"].plan
    blocks = sum(-(-len(prompt) // 4) for prompt in PROMPTS)  # each prompt's K/V, moved once
    assert stats.kv_transfers == len(PROMPTS)
    assert stats.kv_transfer_blocks == blocks
    assert stats.kv_transfer_bytes == blocks * plan.kv_block_bytes
    assert stats.kv_transfer_bytes_per_request == stats.kv_transfer_bytes / len(PROMPTS)
    assert stats.kv_transfer_seconds > 0 and stats.kv_transfer_seconds_per_request > 0
    moved = [o.metrics for o in gqa[3]["prefill-decode"]]  # each next turn's own move
    assert [m.kv_transfer_bytes for m in moved] == [
        -(-len(next_turn(p, o)) // 4) * plan.kv_block_bytes for p, o in zip(PROMPTS, gqa[2]["prefill-decode"],
                                                                           strict=True)]
    assert all(m.kv_transfer_s > 0 for m in moved)
    assert plan.kv_cache_bytes == 2 * config.kv_cache_bytes // plan.kv_block_bytes * plan.kv_block_bytes
    assert stats.kv_cache_bytes == plan.kv_cache_bytes


def test_cancelling_mid_prefill_and_mid_decode_frees_both_sides(gqa):
    engine = gqa[1]["prefill-decode"]
    probe = EngineProbe(engine)
    decoding = engine.submit([7, 8, 9], SamplingParams(max_tokens=400, ignore_eos=True))
    stream = iter(decoding)
    for _ in range(3):
        next(stream)
    # A 400-token prompt takes 25 chunks of 16: it is cancelled from the loop thread while the prefill side holds it
    # (a cancellation is handled right after the calls the loop runs, before its next step).
    prefilling = engine.submit([int(t) for t in torch.randint(3, VOCAB, (400,))],
                               SamplingParams(max_tokens=5, ignore_eos=True))

    def cancel_while_prefilling(backend) -> bool:
        if any(r.request_id == prefilling.request_id for r in backend.prefill.running):
            assert any(r.request_id == decoding.request_id for r in backend.decode.running)
            prefilling.cancel()
            decoding.cancel()
            return True
        return False

    deadline = time.monotonic() + 10
    while not probe.on_loop(cancel_while_prefilling):
        assert time.monotonic() < deadline and not prefilling.done
    assert [h.result().finish_reason for h in (prefilling, decoding)] == ["cancelled", "cancelled"]
    assert wait_until(lambda: held_blocks(engine) == (0, 0), 5)
    stats = engine.stats()
    assert stats.kv_blocks_free == stats.kv_blocks_total and stats.num_running == stats.num_waiting == 0


def test_decode_goes_on_while_the_prefill_worker_is_stopped(gqa):
    """Decode never waits for a prefill: with the prefill worker stopped (SIGSTOP, shorter than the heartbeat
    timeout) while it holds a new prompt's chunk, the decode worker's steps go on; the prompt completes after."""
    engine = gqa[1]["prefill-decode"]
    probe = EngineProbe(engine)
    prefill_pid = engine.stats().rank_pids[0]
    decoding = engine.submit([7, 8, 9], SamplingParams(max_tokens=480, ignore_eos=True))
    stream = iter(decoding)
    for _ in range(3):
        next(stream)
    os.kill(prefill_pid, signal.SIGSTOP)
    try:
        prompt = engine.submit(list(range(3, 200)), SamplingParams(max_tokens=3, ignore_eos=True))
        deadline = time.monotonic() + 5
        while not probe.on_loop(lambda b: any(r.request_id == prompt.request_id for r in b.prefill.running)):
            assert time.monotonic() < deadline
        held = time.perf_counter()  # its first chunk went to the stopped worker
        time.sleep(0.3)
        resumed = time.perf_counter()
        assert not prompt.done
    finally:
        os.kill(prefill_pid, signal.SIGCONT)
    decode_steps = [r for r in engine.step_history(held + 0.005) if r.num_decode_tokens and r.time < resumed]
    assert len(decode_steps) >= 5
    assert prompt.result().finish_reason == "length"
    decoding.cancel()
    assert decoding.result().finish_reason in ("cancelled", "length")
    assert wait_until(lambda: held_blocks(engine) == (0, 0), 5)


def test_mha_equals_one_process(tiny_model_dirs):
    folder = tiny_model_dirs["llama3-rope-scaling"]
    with Engine(EngineConfig(model=folder, dtype="float32")) as engine:
        expected = greedy(engine)
    with Engine(EngineConfig(model=folder, dtype="float32", **DISAGG)) as engine:
        assert greedy(engine) == expected


def test_preempted_decodes_are_recomputed_through_the_prefill_worker(tiny_model_dirs):
    """A decode pool of 20 blocks of 4 cannot hold five 40-token sequences: decodes are preempted, recomputed
    on the prefill side, and the output is unchanged."""
    folder = tiny_model_dirs["llama-gqa"]
    tiny = dict(block_size=4, max_model_len=64, max_num_batched_tokens=32, prefix_caching=True)
    prompts = [[20 + i] * (8 + 3 * i) for i in range(5)]
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    with Engine(EngineConfig(model=folder, dtype="float32", **tiny)) as engine:
        expected = greedy(engine, prompts, params)
        block_bytes = engine.plan.kv_block_bytes
    config = EngineConfig(model=folder, dtype="float32", kv_cache_bytes=20 * block_bytes, **tiny, **DISAGG)
    with Engine(config) as engine:
        assert greedy(engine, prompts, params) == expected
        stats = engine.stats()
        assert stats.num_preemptions > 0
        assert stats.kv_transfers > len(prompts)  # recomputed requests move again
        assert stats.worker_prefill_chunks[1] == 0
        assert held_blocks(engine) == (0, 0)


# ---- faults and clean-up ----------------------------------------------------------------------------

@pytest.mark.parametrize("role", [0, 1], ids=["prefill", "decode"])
def test_a_killed_worker_fails_callers_fast_and_close_frees_everything(role, tiny_model_dirs):
    folder = tiny_model_dirs["llama-gqa"]
    before_children, before_ports = children(), listening_ports()
    engine = Engine(EngineConfig(model=folder, dtype="float32", **DISAGG))
    pids = engine.stats().rank_pids
    name = ("prefill worker", "decode worker")[role]
    try:
        assert set(pids) <= children() - before_children
        handles = [engine.submit([7 + i, 8, 9], SamplingParams(max_tokens=480, ignore_eos=True)) for i in range(3)]
        stream = iter(handles[0])
        for _ in range(3):
            next(stream)
        started = time.monotonic()
        os.kill(pids[role], signal.SIGKILL)
        outputs = results_within(handles, HEARTBEAT_TIMEOUT + 10)
        assert time.monotonic() - started < 3
        assert all(o.finish_reason == "error" for o in outputs)
        assert all(f"{name} (pid {pids[role]})" in o.error and "killed by SIGKILL" in o.error for o in outputs), \
            outputs[0].error
        late = engine.generate([1, 2, 3], GREEDY)[0]
        assert late.finish_reason == "error" and "build a new one" in late.error
        assert any("model steps fail" in note for note in engine.stats().notes)
    finally:
        close_and_check_nothing_left(engine, pids, before_children, before_ports)


NO_CLOSE = """
import json, sys
from engine import Engine, EngineConfig, SamplingParams
if __name__ == "__main__":
    engine = Engine(EngineConfig(model=sys.argv[1], dtype="float32", disaggregation="prefill-decode"))
    print(json.dumps(engine.stats().rank_pids), flush=True)
    engine.generate([1, 2, 3], SamplingParams(max_tokens=20, ignore_eos=True))
    print("done", flush=True)
"""


def test_a_script_that_never_closes_leaves_no_worker(tiny_model_dirs, tmp_path):
    script = tmp_path / "no_close.py"
    script.write_text(NO_CLOSE)
    parent = subprocess.Popen([sys.executable, str(script), tiny_model_dirs["llama-gqa"]], stdout=subprocess.PIPE,
                              cwd=PROJECT_ROOT, text=True, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    try:
        import json

        pids = json.loads(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "done"
        assert parent.wait(120) == 0
        assert wait_until(all_gone(pids), 10), f"workers outlived the script: {describe(*pids)}"
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.parametrize(("setting", "words"), [
    (dict(tensor_parallel_size=2), "tensor or pipeline parallelism"),
    (dict(speculative="ngram"), "speculative decoding"),
    (dict(backend="hf"), "hf backend"),
    (dict(batching="static"), "batching='continuous'"),
])
def test_combinations_it_does_not_run_are_refused(setting, words, tiny_model_dirs):
    with pytest.raises(ConfigError, match=words):
        EngineConfig(model=tiny_model_dirs["llama-gqa"], **DISAGG, **setting)
