"""A short soak of the running playground (`tests/soak/harness.py`; the full one is `python -m tests.soak`).

Two rounds of 60 requests from 8 clients in public mode: a third hang up mid-stream, a sixth are poison
(NaN / huge / negative sampling values, over-long prompts, bad model ids, lone surrogates, broken JSON),
Gradio sessions chat and apply a preset half-way while the OpenAI traffic moves to that configuration,
with more configurations in use than the pool keeps. The checks it makes are tested to fail on bad
outcomes first, so that a clean report means something.
"""

from __future__ import annotations

import pytest

from tests.soak.harness import Job, Snapshot, _finished_right, _server_problems, format_report, soak, start_public_app

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
                      [{**idle, "kv_blocks_free": 7, "num_running": 1}])
    problems = " | ".join(_server_problems(before, harmed))
    for expected in ("still has requests", "KV blocks not freed", "2 engine threads for 1 engines",
                     "request threads left", "'leak': 3", "child processes", "RSS beside"):
        assert expected in problems


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
