"""The measurement slot through the running app: a benchmark's duration is bounded (a minimum request rate, a time
cap, its client leaving), and another session's Compare waits its turn knowing its place.

Why: Compare and Benchmark share one slot server-wide; a /benchmark at 0.001 requests per second, whose client then
left, kept it for hours while every other visitor's Compare waited.
"""

from __future__ import annotations

import http.client
import json
import time
import uuid

import pytest
from gradio_client.exceptions import AppError

from playground.shared.settings import Settings
from tests.support.ui_helpers import api_client, serving

pytestmark = pytest.mark.slow
CAP_S = 4


@pytest.fixture(scope="module")
def running_app(tmp_path_factory):
    with serving(tmp_path_factory, Settings(max_new_tokens=64, max_prompt_tokens=400, max_message_chars=2000,
                                            min_bench_rate=1.0, max_measure_seconds=CAP_S)) as running:
        yield running


def slow_benchmark() -> list:
    """64 requests at the minimum rate of one per second: a minute of measuring, were it not capped."""
    return ["random", None, 64, 0, 1.0, "8", "4", 0, True, 0, 0, 0, ""]


def slot_is_free(app, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        probe = app.measurements.take(object())
        free = probe.holding
        app.measurements.release(probe)
        if free:
            return True
        time.sleep(0.1)
    return False


def test_a_benchmark_slower_than_the_minimum_rate_is_refused(running_app):
    with pytest.raises(AppError, match="PLAYGROUND_MIN_BENCH_RATE"):
        api_client(running_app.url).predict("random", None, 4, 0, 0.001, "8", "4", 0, True, 0, 0, 0,
                                            api_name="/benchmark")


def test_a_capped_benchmark_ends_and_another_sessions_compare_is_told_its_place(running_app):
    benchmarker, comparer = api_client(running_app.url), api_client(running_app.url)
    started = time.monotonic()
    run = benchmarker.submit(*slow_benchmark(), api_name="/benchmark")
    deadline = time.monotonic() + 30
    while not any(isinstance(o, tuple) and o[0].get("phase") == "running" for o in run.outputs()):
        assert time.monotonic() < deadline, "the benchmark never started"
        time.sleep(0.1)
    comparison = comparer.submit("engine panel", "", "engine panel", "", "What is os.path?", 2, 0.0, 1.0, 0, 0, 1,
                                 False, False, api_name="/compare")
    while not any(isinstance(o, dict) and o.get("phase") == "queued" and o.get("ahead") == 1
                  for o in comparison.outputs()):
        assert time.monotonic() < deadline, f"the comparison was not told its place: {comparison.outputs()[-1:]}"
        time.sleep(0.1)
    report, _, _ = run.result(timeout=60)
    assert time.monotonic() - started < CAP_S + 15, "the cap did not end the run"
    assert 0 < report["cancelled_requests"] < 64 and report["completed"] < 64
    outcome = comparison.result(timeout=60)
    assert outcome["labels"] == ["A", "B"] and not outcome["cancelled"]


def test_a_benchmark_whose_client_goes_away_ends(running_app):
    """The client joins /benchmark over Gradio's queue, reads its progress, and hangs up: the run stops and the slot
    is free long before its cap."""
    app, url = running_app.app, running_app.url
    host, port = url.split("//")[1].rstrip("/").split(":")
    fn_index = next(fn._id for fn in running_app.demo.fns.values() if fn.api_name == "benchmark")
    session = uuid.uuid4().hex
    join = http.client.HTTPConnection(host, int(port), timeout=30)
    join.request("POST", "/gradio_api/queue/join", body=json.dumps(
        {"data": [*slow_benchmark(), None], "fn_index": fn_index, "session_hash": session}).encode(),
        headers={"Content-Type": "application/json"})
    assert join.getresponse().status == 200
    join.close()
    events = http.client.HTTPConnection(host, int(port), timeout=30)
    events.request("GET", f"/gradio_api/queue/data?session_hash={session}")
    for line in events.getresponse():
        if b'"phase": "running"' in line or b'"phase":"running"' in line:
            break
    events.close()
    left = time.monotonic()
    assert slot_is_free(app, CAP_S - 1), "the run went on after its client left"
    assert time.monotonic() - left < CAP_S - 1
