"""A short soak of the running playground (`tests/soak/harness.py`; the full one is `python -m tests.soak`).

Three rounds of 60 requests from 8 clients in public mode: a third hang up mid-stream, a sixth are poison
(NaN / huge / negative sampling values, over-long prompts, bad model ids, lone surrogates, broken JSON,
unimplemented fields), Gradio sessions chat and apply a preset half-way while the OpenAI traffic moves to
that configuration, with more configurations in use than the pool keeps; during the last round one
attacker sends 2 MB conversations, 50 MB bodies, abandoned non-streaming calls and a slow benchmark, and
types special tokens (`tests/soak/attacks.py`). The checks it makes are tested to fail on bad outcomes
first, so that a clean report means something.
"""

from __future__ import annotations

import pytest

from tests.soak.harness import (
    Job,
    Snapshot,
    _cancellation_problems,
    _finished_right,
    _server_problems,
    format_report,
    soak,
    start_public_app,
)
from tests.soak.outcome import NO_FIELD, Outcome, refusal_problem

pytestmark = pytest.mark.slow


def test_the_checks_catch_wrong_replies():
    asked = Job(0, "chat", max_tokens=8, exact_length=True)
    assert _finished_right(asked, "length", 8, "text") is None
    assert "ignore_eos" in _finished_right(asked, "stop", 3, "text")
    assert "finish reason" in _finished_right(asked, "cancelled", 8, "text")
    assert "after 5 of 8" in _finished_right(Job(0, "chat", max_tokens=8), "length", 5, "text")
    assert "9 tokens" in _finished_right(Job(0, "chat", max_tokens=8), "stop", 9, "text")
    assert "stop string" in _finished_right(Job(0, "chat", max_tokens=8, stop=("END",)), "stop", 4, "the END")


def test_the_checks_catch_a_harmed_server():
    idle = {"kv_blocks_free": 10, "kv_blocks_total": 10, "num_running": 0, "num_waiting": 0, "config": "a"}
    before = Snapshot(500, 10, 100, {"MainThread": 1, "engine-loop": 1}, 0, [idle])
    assert _server_problems(before, before) == []
    harmed = Snapshot(500 + 400, 10, 100, {"MainThread": 1, "engine-loop": 2, "openai-stream": 1, "leak": 3}, 1,
                      [{**idle, "kv_blocks_free": 7, "num_running": 1}], measurement_slot_free=False)
    problems = " | ".join(_server_problems(before, harmed))
    for expected in ("still has requests", "KV blocks not freed", "2 engine threads for 1 engines",
                     "request threads left", "'leak': 3", "child processes", "RSS beside", "measurement slot"):
        assert expected in problems


def test_the_checks_catch_wrong_refusals_and_uncancelled_departures():
    good = b'{"error": {"message": "top_k must be between 0 and 1000000", "param": "top_k"}}'
    assert refusal_problem(400, good, "top_k", "top_k")[1] is None
    assert "names 'top_k', not 'seed'" in refusal_problem(400, good, "top_k", "seed")[1]
    assert "HTTP 500" in refusal_problem(500, good, "top_k", "top_k")[1]
    assert "without an error message" in refusal_problem(400, b"Internal Server Error", "x", NO_FIELD)[1]
    assert "does not say" in refusal_problem(400, good, "temperature", "top_k")[1]
    left = [Outcome(0, "hang-up", asked_tokens=256), Outcome(1, "disconnect", asked_tokens=2048),
            Outcome(2, "chat", output_tokens=10)]
    assert _cancellation_problems(left, 10 + 500) == []
    assert "did not cancel" in _cancellation_problems(left, 10 + 2304)[0]


def test_the_playground_survives_a_short_soak():
    app, demo, url = start_public_app()
    try:
        report = soak(app, url, requests=60, clients=8, max_tokens=24)
    finally:
        demo.close()
        app.pool.close()
    assert not report.problems, format_report(report)
    assert {"chat", "chat-stream", "completion", "hang-up", "gradio-chat", "poison"} <= set(report.kinds)
    assert report.hung_up == report.kinds["hang-up"] and report.poison_refused == report.kinds["poison"]
    assert report.completed == report.requests - report.hung_up - report.poison_refused
    assert all(e["kv_blocks_free"] == e["kv_blocks_total"] for e in report.after.engines)
    assert set(report.attacks) == {"big-conversation", "huge-body", "disconnect", "injection", "abandoned-benchmark",
                                   "queued-compare"}
    assert all(counts["answered right"] == counts["sent"] for counts in report.attacks.values())
    assert report.after.rss_mib - report.before.rss_mib < 256 and report.after.measurement_slot_free
