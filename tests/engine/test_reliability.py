"""One caller's request never harms another's; a failed or closed engine leaves nothing behind.

Regression tests for issue 11's engine-side bugs, each reproducible before its fix.
"""

from __future__ import annotations

import gc
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref

import pytest
import torch
from safetensors.torch import load_file

from engine import Engine, EngineConfig, ModelLoadError, RequestError, SamplingParams
from engine import engine as engine_module
from engine.core import detokenizer as detokenizer_module
from engine.core import threads as threads_module
from engine.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRINGS
from engine.testing import EngineProbe
from tests.support.child_scripts import CTRL_C_AS_IN_A_TERMINAL
from tests.support.paths import PROJECT_ROOT


@pytest.fixture(scope="module")
def engine(tiny_chat_dir):
    with Engine(EngineConfig(model=tiny_chat_dir, block_size=4, max_num_seqs=8)) as shared:
        yield shared


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "engine-loop" and t.is_alive()]


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -1e-9, "1"])
def test_unusable_temperatures_are_refused_up_front(engine, temperature):
    with pytest.raises(RequestError, match="temperature"):
        engine.submit("hi", SamplingParams(temperature=temperature))


def test_a_vanishing_temperature_is_greedy(engine):
    params = dict(max_tokens=12, ignore_eos=True)
    greedy = engine.generate("The engine", SamplingParams(**params))[0].token_ids
    tiny = engine.generate("The engine", SamplingParams(temperature=1e-40, **params))[0].token_ids
    assert tiny == greedy


@pytest.mark.parametrize("params, message", [
    (dict(seed=2**64), "seed"), (dict(seed=-(2**63) - 1), "seed"), (dict(seed=1.5), "seed"),
    (dict(stop=5), "stop"), (dict(stop=["ok", 3]), "stop"), (dict(stop=[""]), "stop"),
    (dict(stop=["x"] * (MAX_STOP_STRINGS + 1)), "at most"), (dict(stop=["y" * (MAX_STOP_CHARS + 1)]), "at most"),
    (dict(stop=["\ud800"]), "surrogate"), (dict(top_p=float("nan")), "top_p"), (dict(top_k=True), "top_k"),
    (dict(max_tokens=True), "max_tokens"), (dict(ignore_eos="yes"), "ignore_eos"),
])
def test_bad_sampling_values_get_one_clear_error(engine, params, message):
    with pytest.raises(RequestError, match=message):
        engine.submit("hi", SamplingParams(**params))


@pytest.mark.parametrize("prompt, message", [
    (None, "prompt"), ("bad \ud800 text", "surrogate"), ([{"role": "user"}], "content"),
    ([{"role": "user", "content": 5}], "content"), ([{"content": "hi"}], "role"),
    ([{"role": "user", "content": "\udfff"}], "surrogate"), ([True, 2], "prompt"), (3.5, "prompt"),
])
def test_bad_prompts_get_one_clear_error(engine, prompt, message):
    with pytest.raises(RequestError, match=message):
        engine.submit(prompt, SamplingParams(max_tokens=2))
    with pytest.raises(RequestError):
        engine.generate(prompt)


def test_one_failing_request_does_not_end_its_neighbours(engine, monkeypatch):
    """A request that breaks while taking its tokens (here: its detokenizer) fails alone; its batch goes on."""
    real_add = detokenizer_module.IncrementalDetokenizer.add

    def add(self, new_ids, final=False):
        if "POISON" in self.stop:
            raise RuntimeError("broken detokenizer")
        return real_add(self, new_ids, final)

    monkeypatch.setattr(detokenizer_module.IncrementalDetokenizer, "add", add)
    healthy = [engine.submit(f"healthy request {i}", SamplingParams(max_tokens=30, ignore_eos=True))
               for i in range(3)]
    forced = engine.submit("poison", SamplingParams(max_tokens=30, ignore_eos=True, stop=["POISON"]))
    outputs = [h.result() for h in healthy]
    assert all(o.finish_reason == "length" and len(o.token_ids) == 30 for o in outputs)
    bad = forced.result()
    assert bad.finish_reason == "error" and "broken detokenizer" in bad.error
    stats = engine.stats()
    assert stats.kv_blocks_free == stats.kv_blocks_total, "the failed request's blocks were freed"


def test_a_failed_start_releases_the_loop_thread_and_the_model(tiny_llama_dir, monkeypatch):
    before = set(engine_threads())  # other engines' loop threads may end meanwhile (idle), none may start
    models = []
    from engine.runner import build

    real_build = build.build_native_model

    def remember(*args, **kwargs):
        model = real_build(*args, **kwargs)
        models.append(weakref.ref(model))
        return model

    monkeypatch.setattr(build, "build_native_model", remember)
    monkeypatch.setattr(Engine, "_warm_up", lambda self: (_ for _ in ()).throw(ModelLoadError("warm-up broke")))
    for _ in range(3):
        with pytest.raises(ModelLoadError, match="warm-up broke"):
            Engine(EngineConfig(model=tiny_llama_dir))
    gc.collect()
    assert not set(engine_threads()) - before, "a failed Engine() left its loop thread running"
    assert models and all(ref() is None for ref in models), "a failed Engine() kept its model alive"


def test_the_smallest_context_serves(tiny_llama_dir):
    with Engine(EngineConfig(model=tiny_llama_dir, max_model_len=4, block_size=4)) as small:
        output = small.generate([5, 6], SamplingParams(max_tokens=10, ignore_eos=True))[0]
    assert output.finish_reason == "length" and len(output.token_ids) == 2


def test_close_frees_the_model_and_says_so(tiny_llama_dir):
    engine = Engine(EngineConfig(model=tiny_llama_dir))
    weights = weakref.ref(next(EngineProbe(engine).model().parameters()))
    cache = weakref.ref(EngineProbe(engine).kv_storage())
    pending = engine.submit([5, 6, 7], SamplingParams(max_tokens=100, ignore_eos=True))
    engine.close()
    output = pending.result()
    gc.collect()
    assert weights() is None and cache() is None, "close() left the model or the KV pool alive"
    assert output.finish_reason in ("aborted", "length")
    if output.finish_reason == "aborted":
        assert "closed" in output.error
    stats = engine.stats()
    assert stats.closed is True and stats.kv_cache_bytes == 0
    with pytest.raises(RequestError, match="closed"):
        engine.submit([1, 2])


def test_streams_ended_by_close_are_aborted_not_cancelled(tiny_llama_dir):
    engine = Engine(EngineConfig(model=tiny_llama_dir, max_model_len=512))
    handle = engine.submit([5, 6, 7], SamplingParams(max_tokens=500, ignore_eos=True))
    next(iter(handle))
    engine.close()
    output = handle.result()
    assert output.finish_reason == "aborted" and output.error == "the engine was closed"


def test_a_long_stop_string_does_not_hold_back_the_stream(engine):
    stop = "z" * MAX_STOP_CHARS
    deltas = list(engine.stream("The engine", SamplingParams(max_tokens=30, ignore_eos=True, stop=[stop])))
    text = "".join(d.text for d in deltas)
    assert "z" * 10 not in text
    streamed_before_end = "".join(d.text for d in deltas[:-1])
    assert len(streamed_before_end) >= len(text) - 2, "text was held back until the request ended"


def test_the_hf_backend_refuses_pickled_checkpoints(tiny_llama_dir, tmp_path):
    folder = tmp_path / "pickled"
    shutil.copytree(tiny_llama_dir, folder)
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="safetensors"):
        Engine(EngineConfig(model=str(folder), backend="hf"))
    with pytest.raises(ModelLoadError, match="safetensors"):
        Engine(EngineConfig(model=str(folder), backend="native"))


def test_a_caller_that_sees_its_request_finished_sees_its_blocks_free(engine, monkeypatch):
    """The final delta is published once the request's KV blocks are free. Before, `stats()` right after
    `generate()` could still count them in use (the loop frees them later in the step): a flaky test elsewhere."""
    scheduler = EngineProbe(engine).scheduler()
    complete_step = scheduler.complete_step

    def slow_complete_step(items):
        time.sleep(0.3)  # a loaded machine descheduling the loop between delivering tokens and freeing blocks
        return complete_step(items)

    monkeypatch.setattr(scheduler, "complete_step", slow_complete_step)
    engine.generate("The engine", SamplingParams(max_tokens=3, ignore_eos=True))
    stats = engine.stats()
    assert stats.kv_blocks_free == stats.kv_blocks_total and stats.num_running == 0


@pytest.mark.parametrize("backend", ["native", "hf", "auto"])
def test_remote_code_in_a_model_folder_is_never_run(backend, tmp_path):
    """A checkpoint that needs its own Python code (auto_map) is refused on every backend, its code unrun."""
    code = "import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('remote code ran')\n"
    for module in ("configuration_custom", "modeling_custom"):
        (tmp_path / f"{module}.py").write_text(code)
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "custom", "architectures": ["CustomForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_custom.CustomConfig",
                     "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}}))
    with pytest.raises(ModelLoadError, match="custom code"):
        Engine(EngineConfig(model=str(tmp_path), backend=backend))
    assert not (tmp_path / "RAN").exists()


def test_the_engines_threads_leave_ctrl_c_to_the_main_thread(engine):
    """The kernel may hand a process's SIGINT to any thread that does not block it; Python only acts on it in the
    main thread, so a helper thread that took it would leave a sleeping main thread asleep (engine.core.threads)."""
    blocked = EngineProbe(engine).on_loop(lambda backend: signal.pthread_sigmask(signal.SIG_BLOCK, []))
    assert {signal.SIGINT, signal.SIGTERM} <= blocked


def test_the_model_loads_on_a_thread_that_has_ended_when_the_engine_is_ready(tiny_llama_dir, monkeypatch):
    """A thread that ran torch's parallel CPU operators keeps an OpenMP pool while it lives; beside the loop
    thread's, it made libgomp put its threads to sleep between regions (engine.core.threads.run_on_passing_thread):
    the caller's thread must not be the one that loads."""
    loaded_on = []
    make_backend = engine_module.make_backend

    def recording(*args):
        loaded_on.append(threading.current_thread())
        return make_backend(*args)

    monkeypatch.setattr(engine_module, "make_backend", recording)
    with Engine(EngineConfig(model=tiny_llama_dir, dtype="float32")) as loaded:
        assert loaded.generate([[5, 6, 7]], SamplingParams(max_tokens=2, ignore_eos=True))[0].finish_reason == "length"
        assert loaded_on[0] is not threading.current_thread() and not loaded_on[0].is_alive()


def test_a_failed_load_raises_its_own_error_in_the_caller(tiny_llama_dir, monkeypatch):
    def failing(*args):
        raise ModelLoadError("the weights are unreadable")

    monkeypatch.setattr(engine_module, "make_backend", failing)
    with pytest.raises(ModelLoadError, match="unreadable"):
        Engine(EngineConfig(model=tiny_llama_dir, dtype="float32"))


def test_a_result_that_comes_after_the_caller_gave_up_is_discarded(monkeypatch):
    """A Ctrl-C while the caller waits: the load goes on, and what it returns is released, not leaked."""
    release, discarded = threading.Event(), []

    def interrupted_wait(futures, timeout):
        raise KeyboardInterrupt

    monkeypatch.setattr(threads_module, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        threads_module.run_on_passing_thread(lambda: release.wait(5) and "backend", "test-load", discarded.append)
    release.set()
    deadline = time.monotonic() + 5
    while not discarded and time.monotonic() < deadline:
        time.sleep(0.01)
    assert discarded == ["backend"]


CTRL_C_ELSEWHERE = CTRL_C_AS_IN_A_TERMINAL + """
import signal, sys, threading, time
from engine import Engine, EngineConfig, SamplingParams
from engine.testing import EngineProbe
engine = Engine(EngineConfig(model=sys.argv[1]))
stalled = threading.Event()
stall = lambda backend: (stalled.set(), time.sleep(5))  # the loop busy: no tokens for 5 s
threading.Thread(target=EngineProbe(engine).on_loop, args=(stall,), daemon=True).start()
stalled.wait()
handle = engine.submit([5, 6, 7], SamplingParams(max_tokens=50, ignore_eos=True))

def ctrl_c_on_this_thread():
    time.sleep(0.5)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)

threading.Thread(target=ctrl_c_on_this_thread).start()
started = time.monotonic()
try:
    handle.result()
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - started:.1f} s", flush=True)
finally:
    engine.close()
"""


def test_ctrl_c_that_reaches_another_thread_interrupts_a_waiting_caller():
    """A caller blocked in `result()` while no tokens come (the loop busy for 5 s) wakes up for a SIGINT that
    another thread received; before, it slept until the next token arrived."""
    root = PROJECT_ROOT
    run = subprocess.run([sys.executable, "-c", CTRL_C_ELSEWHERE, "demo"], capture_output=True, text=True,
                         cwd=root, timeout=300)
    assert run.stdout.startswith("interrupted after"), run.stdout + run.stderr[-2000:]
    assert float(run.stdout.split()[2]) < 3, run.stdout


def test_an_idle_loop_thread_ends_and_work_starts_another(tiny_llama_dir):
    """An idle engine holds no thread (and so no OpenMP pool: several loaded engines' pools made libgomp park its
    threads between every operator of the one that works); the next request is served as before."""
    with Engine(EngineConfig(model=tiny_llama_dir, dtype="float32")) as idle:
        probe = EngineProbe(idle)
        first = probe.on_loop(lambda backend: threading.current_thread())
        deadline = time.monotonic() + 10
        while first.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not first.is_alive() and probe.loop_thread() is None
        output = idle.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True))[0]
        assert output.finish_reason == "length" and len(output.token_ids) == 3
        assert probe.on_loop(lambda backend: threading.current_thread()) is not first


ENDS_WITHOUT_CLOSE = """import sys
from engine import Engine, EngineConfig, SamplingParams
engine = Engine(EngineConfig(model="demo", cpu_kernels=sys.argv[1] != "pure-pytorch",
                             tensor_parallel_size=2 if sys.argv[1] == "tensor-parallel" else 1))
print(engine.generate("def add(a, b):", SamplingParams(max_tokens=16, ignore_eos=True))[0].finish_reason)
"""


@pytest.mark.parametrize("variant", ["kernels", "pure-pytorch", "tensor-parallel"])
def test_a_script_that_ends_without_close_exits_cleanly(variant):
    """Users of an engine do not always call close(): the interpreter's exit closes what is still open. Before,
    the process aborted at exit ("terminate called without an active exception", status 134) in most runs."""
    run = subprocess.run([sys.executable, "-c", ENDS_WITHOUT_CLOSE, variant], cwd=PROJECT_ROOT, capture_output=True,
                         text=True, timeout=300)
    assert (run.returncode, run.stdout.strip()) == (0, "length"), run.stderr[-2000:]
    assert "terminate called" not in run.stderr
