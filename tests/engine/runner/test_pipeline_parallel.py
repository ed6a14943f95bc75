"""Pipeline parallelism end to end: N=2 stage processes on this CPU (gloo), and its figures.

Greedy output with N=2 equals N=1 in float32 on random models (GQA, MHA, tied MQA), under both
batching modes, prefix caching, chunked prefill and preemption, with both schedules and 1 to 3
micro-batches. A request cancelled while its micro-batch is in flight leaves cleanly. A stage
killed mid-generation fails the waiting callers within seconds naming it; after `close()`, or when
a script ends without it, no stage process or listening port is left. Bad sizes get one clear
message each. The bubble arithmetic is checked on synthetic timelines, and the live figures for
consistency (timings on a shared 2-core machine are too noisy to assert; `engine.tools.pipeline_bubbles`
measures them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine import ConfigError, Engine, EngineConfig, SamplingParams, unavailable_reason
from engine.core.block_manager import BlockManager
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.host import cpu_cores
from engine.pipeline_stats import PipelineStats, Span, bubble_share, textbook_bubble, window_bubble
from engine.plan import _check_pipeline
from engine.runner.pp_executor import split_evenly
from engine.runner.pp_worker import head_cost_in_layers, stage_layers
from engine.runner.worker_gang import HEARTBEAT_TIMEOUT
from engine.testing import EngineProbe
from tests.support.paths import PROJECT_ROOT
from tests.support.worker_processes import (
    GREEDY,
    MAX_TOKENS,
    PROMPTS,
    all_gone,
    children,
    close_and_check_nothing_left,
    greedy,
    listening_ports,
    results_within,
    wait_until,
)

pipelined = pytest.mark.skipif(cpu_cores() < 2, reason="two stages need two CPU cores")


# ---- the arithmetic: layer split, micro-batches, bubbles ---------------------------------------------

def test_layers_split_contiguously_with_the_lm_head_counted():
    assert stage_layers(2, 2) == [(0, 1), (1, 2)]
    assert stage_layers(4, 2) == [(0, 2), (2, 4)]
    assert stage_layers(7, 3) == [(0, 2), (2, 4), (4, 7)]
    # an LM head worth 1.45 layers: the last stage takes one layer of four
    assert stage_layers(4, 2, 1.45) == [(0, 3), (3, 4)]
    assert stage_layers(4, 2, 0.5) == [(0, 2), (2, 4)]
    assert stage_layers(2, 2, 5.0) == [(0, 1), (1, 2)]  # every stage keeps a layer
    for layers, stages, head in [(30, 3, 0.5), (80, 8, 2.0), (5, 5, 1.0)]:
        ranges = stage_layers(layers, stages, head)
        assert ranges[0][0] == 0 and ranges[-1][1] == layers and all(b > a for a, b in ranges)
        assert all(ranges[i][1] == ranges[i + 1][0] for i in range(stages - 1))


def test_head_cost_counts_matmul_weights_at_half_a_layer_weight_s_time():
    from engine.model.spec import ModelSpec
    spec = ModelSpec("LlamaForCausalLM", 8192, 512, 4, 8, 4, 64, 1376, 1e-5, False, False, False, False, 4096, None)
    # layer: 512 x (512 + 2 x 256) + 512 x 512 + 3 x 512 x 1376 = 2.88M; head: 8192 x 512 = 4.19M
    assert head_cost_in_layers(spec) == pytest.approx(0.5 * 8192 * 512 / (512 * 1024 + 512 * 512 + 3 * 512 * 1376))
    assert stage_layers(4, 2, head_cost_in_layers(spec)) == [(0, 2), (2, 4)]


def test_micro_batches_split_evenly_in_order():
    assert split_evenly([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
    assert split_evenly([1, 2], 4) == [[1], [2]]
    assert split_evenly([1, 2, 3], 1) == [[1, 2, 3]]


def gpipe_timeline(stages: int, micro_batches: int, cost: float = 1.0) -> list[Span]:
    """A flushed forward pass of equal micro-batches: stage k works on micro-batch j during slot j + k."""
    return [Span(stage, j, (j + stage) * cost, (j + stage + 1) * cost)
            for j in range(micro_batches) for stage in range(stages)]


@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 1), (2, 2), (2, 4), (3, 2), (4, 8)])
def test_bubble_of_a_synthetic_gpipe_timeline_is_the_textbook_one(stages, micro_batches):
    spans = gpipe_timeline(stages, micro_batches, cost=0.25)
    active = (micro_batches + stages - 1) * 0.25
    busy = [sum(s.end - s.start for s in spans if s.stage == k) for k in range(stages)]
    expected = (stages - 1) / (micro_batches + stages - 1)
    assert textbook_bubble(stages, micro_batches) == pytest.approx(expected)
    assert bubble_share(busy, active) == pytest.approx(expected)
    assert window_bubble(spans, stages, 0.0, active) == pytest.approx(expected)
    figures = PipelineStats(stages, micro_batches, "flush", micro_batches, active, tuple(busy), 0, tuple(spans))
    assert figures.bubble_share == pytest.approx(expected)
    assert figures.stage_idle_seconds == pytest.approx([active - b for b in busy])
    assert figures.textbook_bubble_share == pytest.approx(expected)


def test_steady_overlap_window_has_no_bubble_and_a_gap_shows():
    """Two stages, two micro-batches always in flight: in the steady part both stages are always busy; a gap of
    half a slot on stage 1 each slot is a quarter of the two stages' time."""
    spans = [Span(k, j, j + k, j + k + 1) for j in range(20) for k in range(2)]
    assert window_bubble(spans, 2, 5.0, 15.0) == pytest.approx(0.0)
    gappy = [Span(k, j, j + k, j + k + (1 if k == 0 else 0.5)) for j in range(20) for k in range(2)]
    assert window_bubble(gappy, 2, 5.0, 15.0) == pytest.approx(0.25)


def test_figures_since_an_earlier_snapshot():
    early = PipelineStats(2, 2, "overlap", 4, 1.0, (0.5, 0.6), 100)
    late = PipelineStats(2, 2, "overlap", 10, 3.0, (1.5, 2.0), 400)
    window = late.since(early)
    assert (window.micro_batches_run, window.active_seconds, window.bytes_between_stages) == (6, 2.0, 300)
    assert window.stage_busy_seconds == pytest.approx((1.0, 1.4))
    assert window.bubble_share == pytest.approx((1.0 + 0.6) / 4.0)


def test_the_scheduler_skips_and_never_preempts_in_flight_requests():
    """Three running requests, one block free: the next to grow must preempt someone, and the in-flight ones are
    neither scheduled nor chosen; the most recent request not in flight is."""
    manager = BlockManager(7, 4, prefix_caching=False)
    scheduler = Scheduler(manager, "continuous", max_num_seqs=4, max_num_batched_tokens=64)
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    requests = [Request(list(range(1, 9)), params, frozenset(), 1000, IncrementalDetokenizer(None, [1]), seed=0)
                for _ in range(3)]
    for request in requests:
        scheduler.add(request)
    first = scheduler.schedule()
    assert [item.request for item in first] == requests and manager.num_free_blocks == 1
    for item in first:
        item.request.append_tokens([9], now=0.0)
    scheduler.complete_step(first)
    in_flight = {requests[1].request_id, requests[2].request_id}
    [item] = scheduler.schedule(busy=in_flight)  # requests[0] grows into the free block
    assert item.request is requests[0] and scheduler.num_preemptions == 0
    item.request.append_tokens([9] * 4, now=1.0)
    scheduler.complete_step([item])
    assert scheduler.schedule(busy=in_flight | {requests[0].request_id}) == []
    # requests[0] needs a fourth block and none is free: the only request it may preempt is itself
    assert scheduler.schedule(busy=in_flight) == []
    assert scheduler.num_preemptions == 1 and list(scheduler.waiting) == [requests[0]]
    assert scheduler.running == requests[1:]


# ---- equality: N=2 equals N=1 -----------------------------------------------------------------------

PAGED = dict(prefix_caching=True, block_size=4, max_num_batched_tokens=16, kv_cache_bytes=2**20)
STATIC = dict(batching="static", prefix_caching=False, max_num_seqs=3)
PREEMPTING = dict(block_size=4, max_num_seqs=5, kv_cache_bytes=None)  # kv_cache_bytes: set from the model below

CASES = {
    "gqa-paged-overlap": ("llama-gqa", PAGED, "overlap", None),
    "gqa-paged-overlap-3": ("llama-gqa", PAGED, "overlap", 3),
    "gqa-paged-flush-3": ("llama-gqa", PAGED, "flush", 3),
    "gqa-static-overlap-2": ("llama-gqa", STATIC, "overlap", 2),
    "gqa-static-flush-2": ("llama-gqa", STATIC, "flush", 2),
    "mha-overlap-1": ("llama3-rope-scaling", {}, "overlap", 1),
    "mqa-tied-flush-2": ("llama-mqa-tied", {}, "flush", 2),
}


@pytest.fixture(scope="module")
def references(tiny_model_dirs):
    cache = {}

    def reference(arch: str, settings: dict) -> list[list[int]]:
        key = (arch, tuple(sorted(settings.items())))
        if key not in cache:
            with Engine(EngineConfig(model=tiny_model_dirs[arch], dtype="float32", **settings)) as engine:
                cache[key] = greedy(engine)
        return cache[key]
    return reference


@pipelined
@pytest.mark.parametrize("case", list(CASES))
def test_two_stages_equal_one(case, tiny_model_dirs, references):
    arch, settings, schedule, micro_batches = CASES[case]
    config = EngineConfig(model=tiny_model_dirs[arch], dtype="float32", pipeline_parallel_size=2,
                          pipeline_schedule=schedule, pipeline_micro_batches=micro_batches, **settings)
    with Engine(config) as engine:
        assert greedy(engine) == references(arch, settings)
        stats = engine.stats()
    assert stats.kv_blocks_free == stats.kv_blocks_total
    if settings is PAGED:
        assert stats.prefix_cache_hit_rate > 0
    assert stats.pipeline.micro_batches == (micro_batches or 2)
    if schedule == "flush" and (micro_batches or 2) > 1:
        assert stats.pipeline.micro_batches_run > stats.steps / 2  # steps were split


@pipelined
@pytest.mark.parametrize("schedule", ["overlap", "flush"])
def test_preemption_while_micro_batches_are_in_flight(schedule, tiny_model_dirs, references):
    """A KV pool that holds a few sequences: requests are preempted and recomputed, output unchanged."""
    folder = tiny_model_dirs["llama-gqa"]
    with Engine(EngineConfig(model=folder, dtype="float32", block_size=4)) as probe:
        block_bytes = probe.stats().kv_cache_bytes // probe.stats().kv_blocks_total
    settings = dict(PREEMPTING, kv_cache_bytes=block_bytes * 40, max_model_len=96)
    config = EngineConfig(model=folder, dtype="float32", pipeline_parallel_size=2, pipeline_schedule=schedule,
                          **settings)
    with Engine(config) as engine:
        assert greedy(engine) == references("llama-gqa", settings)
        stats = engine.stats()
    assert stats.num_preemptions > 0
    assert stats.kv_blocks_free == stats.kv_blocks_total


@pytest.fixture(scope="module")
def overlap_engine(tiny_model_dirs):
    with Engine(EngineConfig(model=tiny_model_dirs["llama-gqa"], dtype="float32", pipeline_parallel_size=2,
                             pipeline_micro_batches=2, max_num_seqs=4)) as engine:
        yield engine


def watch_in_flight_removals(engine: Engine) -> tuple[list[bool], list[int]]:
    """From now on: whether each cancellation found its request in flight (deferred), and the ids of in-flight
    requests whose blocks were freed (must stay empty: the stages are still writing their K/V)."""
    deferred: list[bool] = []
    freed_in_flight: list[int] = []

    def install(backend) -> None:
        manager = backend.block_manager
        real_abort, real_free = backend.abort, manager.free

        def abort(request):
            deferred.append(request.request_id in backend.busy)
            real_abort(request)

        def free(seq_id):
            if seq_id in backend.busy:
                freed_in_flight.append(seq_id)
            return real_free(seq_id)

        backend.abort, manager.free = abort, free

    EngineProbe(engine).on_loop(install)
    return deferred, freed_in_flight


@pipelined
def test_cancelled_in_flight_requests_leave_and_the_others_go_on(overlap_engine, references):
    """Two micro-batches of two requests: between steps one of them is in flight, so cancelling three requests at
    once finds at least one in flight; its blocks are held until its micro-batch is back."""
    engine = overlap_engine
    deferred, freed_in_flight = watch_in_flight_removals(engine)
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    handles = [engine.submit(prompt, params) for prompt in PROMPTS[:4]]
    stream = iter(handles[0])
    for _ in range(3):
        next(stream)
    for handle in handles[1:]:
        handle.cancel()
    outputs = results_within(handles, 60)
    assert [o.finish_reason for o in outputs] == ["length"] + ["cancelled"] * 3
    assert outputs[0].token_ids[:MAX_TOKENS] == references("llama-gqa", {})[0]
    assert any(deferred), "no cancellation found its request in flight"
    assert not freed_in_flight, f"blocks of in-flight requests freed: {freed_in_flight}"
    assert wait_until(lambda: engine.stats().kv_blocks_free == engine.stats().kv_blocks_total, 5)
    assert greedy(engine) == references("llama-gqa", {})  # the engine goes on serving


# ---- figures -------------------------------------------------------------------------------------------

@pipelined
def test_live_figures_are_present_and_consistent(overlap_engine, tiny_model_dirs):
    engine = overlap_engine
    greedy(engine)
    stats = engine.stats()
    figures = stats.pipeline
    assert stats.pipeline_parallel_size == 2 and stats.tensor_parallel_size == 1
    assert len(stats.rank_pids) == 2 and os.getpid() not in stats.rank_pids
    assert figures.stages == 2 and figures.schedule == "overlap" and figures.micro_batches == 2
    assert figures.textbook_bubble_share == pytest.approx(1 / 3)
    assert figures.active_seconds > 0 and figures.micro_batches_run > 0
    assert all(busy > 0 for busy in figures.stage_busy_seconds)
    assert all(busy <= figures.active_seconds for busy in figures.stage_busy_seconds)
    assert all(busy + idle == pytest.approx(figures.active_seconds)
               for busy, idle in zip(figures.stage_busy_seconds, figures.stage_idle_seconds, strict=True))
    assert 0 < figures.bubble_share < 1
    assert figures.bytes_between_stages > 0
    spans = figures.timeline
    assert {span.stage for span in spans} == {0, 1} and all(span.end >= span.start for span in spans)
    # a micro-batch reaches stage 1 only after stage 0 handed it on (one clock for all processes)
    starts = {(span.stage, span.micro_batch): span for span in spans}
    for (stage, batch), span in starts.items():
        if stage == 1 and (0, batch) in starts:
            assert span.start >= starts[(0, batch)].end
    # each stage holds its layer and its part of the KV pool: half the blocks' bytes each (one layer of two)
    with Engine(EngineConfig(model=tiny_model_dirs["llama-gqa"], dtype="float32", max_num_seqs=4)) as one:
        single = one.stats()
    assert stats.rank_kv_cache_bytes == (single.kv_cache_bytes // 2,) * 2
    assert stats.kv_blocks_total == single.kv_blocks_total
    assert all(0 < weights < single.weights_bytes for weights in stats.rank_weights_bytes)


# ---- faults and clean-up ----------------------------------------------------------------------------

@pipelined
def test_a_killed_stage_fails_callers_fast_and_close_frees_everything(tiny_model_dirs):
    folder = tiny_model_dirs["llama-gqa"]
    before_children, before_ports = children(), listening_ports()
    engine = Engine(EngineConfig(model=folder, dtype="float32", pipeline_parallel_size=2))
    pids = engine.stats().rank_pids
    try:
        assert set(pids) <= children() - before_children
        handles = [engine.submit([7 + i, 8, 9], SamplingParams(max_tokens=2000, ignore_eos=True))
                   for i in range(3)]
        stream = iter(handles[0])
        for _ in range(3):
            next(stream)
        started = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        outputs = results_within(handles, HEARTBEAT_TIMEOUT + 10)
        elapsed = time.monotonic() - started
        assert all(o.finish_reason == "error" for o in outputs)
        assert all(f"pipeline stage 1 (pid {pids[1]})" in o.error and "killed by SIGKILL" in o.error
                   for o in outputs), outputs[0].error
        assert elapsed < 3
        late = engine.generate([1, 2, 3], GREEDY)[0]
        assert late.finish_reason == "error" and "build a new one" in late.error
        assert any("model steps fail" in note for note in engine.stats().notes)
    finally:
        close_and_check_nothing_left(engine, pids, before_children, before_ports)


NO_CLOSE = """import json, sys
from engine import Engine, EngineConfig, SamplingParams
if __name__ == "__main__":
    engine = Engine(EngineConfig(model=sys.argv[1], dtype="float32", pipeline_parallel_size=2))
    print(json.dumps(engine.stats().rank_pids), flush=True)
    engine.generate([1, 2, 3], SamplingParams(max_tokens=20, ignore_eos=True))
"""


@pipelined
def test_a_script_that_exits_without_close_leaves_no_stage(tiny_model_dirs, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(NO_CLOSE)
    run = subprocess.run([sys.executable, str(script), tiny_model_dirs["llama-gqa"]], cwd=PROJECT_ROOT,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    pids = [int(pid) for pid in run.stdout.strip().strip("[]").split(",")]
    assert len(pids) == 2
    assert wait_until(all_gone(pids), 10)


# ---- bad values ---------------------------------------------------------------------------------------

def test_zero_stages_is_refused():
    with pytest.raises(ConfigError, match="pipeline_parallel_size must be a positive integer, got 0"):
        EngineConfig(pipeline_parallel_size=0).validate()
    assert "positive" in unavailable_reason("pipeline_parallel_size", 0)


def test_more_stages_than_layers_is_refused_before_any_stage_starts(tmp_path):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=24, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    before = children()
    with pytest.raises(ConfigError, match="pipeline_parallel_size=2: this model has 1 decoder layer"):
        Engine(EngineConfig(model=str(tmp_path), dtype="float32", pipeline_parallel_size=2))
    assert children() <= before


def test_more_stages_than_cores_are_refused():
    too_many = cpu_cores() + 1
    assert f"{too_many} CPU cores" in unavailable_reason("pipeline_parallel_size", too_many, "cpu")
    with pytest.raises(ConfigError, match="CPU cores"):
        EngineConfig(device="cpu", pipeline_parallel_size=too_many).validate()


def test_tensor_parallel_stages_are_refused():
    if cpu_cores() < 4:  # four processes on fewer cores: the configuration itself is refused
        with pytest.raises(ConfigError, match="pipeline_parallel_size=2 x tensor_parallel_size=2"):
            EngineConfig(device="cpu", pipeline_parallel_size=2, tensor_parallel_size=2).validate()
    # where the cores would allow it, the plan refuses to compose them
    with pytest.raises(ConfigError, match="not built; use one or the other"):
        _check_pipeline(SimpleNamespace(pipeline_parallel_size=2, tensor_parallel_size=2),
                        SimpleNamespace(num_layers=4))
