"""`engine.tools.measure`: what the bench and the playground's Compare and Benchmark tabs share.

Cancelling a run sends nothing more, cancels what is in flight and returns only once every request it
sent has finished; each finished request is reported as it ends; the sampling settings reach every
request, with the same per-request seeds on every run (what makes two configurations comparable).
"""

from __future__ import annotations

import threading
import time

import pytest

from engine import BenchRequest, Engine, EngineConfig, GuidedDecoding, WorkloadSpec, bench_report, measure_engine
from engine.tools.measure import send
from tests.support.engine_waits import wait_for_steps, wait_until_idle


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    engine = Engine(EngineConfig(model=tiny_llama_dir, max_num_seqs=2, max_model_len=512))
    yield engine
    engine.close()


def long_requests(count: int, max_tokens: int = 400) -> list[BenchRequest]:
    return [BenchRequest([5 + i, 6, 7, 8, 9], max_tokens, 0.0) for i in range(count)]


def cancel_after_steps(engine, count: int) -> threading.Event:
    cancel, since = threading.Event(), time.perf_counter()

    def watch() -> None:
        wait_for_steps(engine, since, count)
        cancel.set()

    threading.Thread(target=watch, daemon=True).start()
    return cancel


def test_a_cancelled_send_stops_sending_cancels_what_runs_and_leaves_nothing_running(engine):
    finished = []
    cancel = cancel_after_steps(engine, 5)
    outputs, _ = send(engine, long_requests(6), 2, 0.0, True, 0, cancel=cancel,
                      on_output=lambda index, output: finished.append((index, output.finish_reason)))
    sent = [o for o in outputs if o is not None]
    assert 1 <= len(sent) <= 3, "with two in flight, cancelling after 5 steps sends at most the next one"
    assert all(o.finish_reason == "cancelled" and len(o.token_ids) < 400 for o in sent)
    assert sorted(finished) == sorted((i, "cancelled") for i, o in enumerate(outputs) if o is not None)
    stats = wait_until_idle(engine)
    assert stats.num_running == 0 and stats.num_waiting == 0


def test_a_cancelled_measurement_counts_only_finished_requests(engine):
    result = measure_engine(engine, WorkloadSpec(num_prompts=4), 2, 0.0, True, warmup=False,
                            requests=long_requests(4), cancel=cancel_after_steps(engine, 5))
    assert result["completed"] == 0 and result["cancelled_requests"] == 4 and result["total_output_tokens"] == 0
    assert wait_until_idle(engine).num_running == 0


def test_every_request_is_reported_as_it_finishes_and_sampling_reaches_each_one(engine):
    requests = long_requests(4, max_tokens=12)
    seen = []
    result = measure_engine(engine, WorkloadSpec(num_prompts=4), 4, 0.9, True, warmup=False, requests=requests,
                            goodput_slos={"ttft": 1e9}, on_output=lambda index, output: seen.append(output))
    assert len(seen) == 4 and result["completed"] == 4 and result["total_output_tokens"] == 48
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])

    def tokens(temperature: float, top_k: int, seed: int) -> list[list[int]]:
        outputs, _ = send(engine, requests, 4, temperature, True, seed, top_k=top_k)
        return [o.token_ids for o in outputs]

    assert tokens(0.9, 0, seed=3) == tokens(0.9, 0, seed=3), "the same seed must give the same samples"
    assert tokens(0.9, 0, seed=3) != tokens(0.9, 0, seed=4)
    assert tokens(1.5, 1, seed=3) == tokens(0.0, 0, seed=3), "top_k=1 must sample the greedy token"


def test_the_report_holds_the_workload_and_writes_an_infinite_rate_as_text():
    spec = WorkloadSpec(num_prompts=3, request_rate=float("inf"))
    report = bench_report({"completed": 3}, spec, 2, 0.0, True, "static", {"ttft": 200.0})
    assert report["completed"] == 3 and report["preset"] == "static" and report["workload"]["request_rate"] == "inf"
    assert report["workload"]["concurrency"] == 2 and report["workload"]["goodput_slos"] == {"ttft": 200.0}
    assert {"device_name", "torch_threads", "source_revision"} <= set(report)


def test_peak_running_and_preemptions_cover_the_measured_run_only(engine):
    """An engine that served a wider batch earlier (the playground's pool) reports this run's own peak."""
    wide = measure_engine(engine, WorkloadSpec(num_prompts=4), 4, 0.0, True, warmup=False,
                          requests=long_requests(4, max_tokens=6))
    narrow = measure_engine(engine, WorkloadSpec(num_prompts=3), 1, 0.0, True, warmup=False,
                            requests=long_requests(3, max_tokens=6))
    assert wide["peak_running"] == 2 and narrow["peak_running"] == 1
    assert engine.stats().peak_running == 2 and narrow["num_preemptions"] == 0



def test_a_measurement_decodes_every_request_under_the_grammar_it_is_given():
    """What Compare's timed run of a structured side relies on: each request of the workload carries the grammar,
    and its mask work is measured."""
    with Engine(EngineConfig(model="demo")) as demo:
        requests = [BenchRequest(demo.encode(f"Is {name} in the standard library?"), 8, 0.0)
                    for name in ("json", "numpy", "os")]
        seen = []
        result = measure_engine(demo, WorkloadSpec(num_prompts=3), 3, 0.0, False, warmup=False, requests=requests,
                                guided=GuidedDecoding("regex", "(yes|no)"), on_output=lambda i, o: seen.append(o))
    assert result["completed"] == 3
    assert all(o.text in ("yes", "no") and o.finish_reason == "stop" for o in seen), [o.text for o in seen]
    assert all(o.metrics.guided_mask_s > 0 for o in seen)
