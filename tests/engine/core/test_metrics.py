"""Metric formulas on synthetic timestamps, the detokenizer on tricky text, and the sampler's filters."""

from __future__ import annotations

import pytest

from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.metrics import RequestMetrics, percentile, summarize


def test_request_metrics_follow_the_definitions():
    metrics = RequestMetrics.from_timestamps(10.0, [10.5, 10.7, 11.0, 11.6], prompt_tokens=20, cached_tokens=16)
    assert metrics.ttft == pytest.approx(0.5)
    assert metrics.e2el == pytest.approx(1.6)
    assert metrics.tpot == pytest.approx(0.366667, abs=1e-6)  # 1.1 s over the 3 tokens after the first
    assert metrics.itl == pytest.approx([0.2, 0.3, 0.6])
    assert metrics.output_tokens == 4 and metrics.cached_tokens == 16
    running = RequestMetrics.from_timestamps(10.0, [10.5, 10.7, 11.0, 11.6], prompt_tokens=20, with_itl=False)
    assert running.itl == [] and running.tpot == pytest.approx(0.366667, abs=1e-6)
    assert running.ttft == pytest.approx(0.5) and running.e2el == pytest.approx(1.6)


def test_single_token_request_has_no_tpot():
    metrics = RequestMetrics.from_timestamps(0.0, [0.25], prompt_tokens=3)
    assert metrics.ttft == metrics.e2el == 0.25
    assert metrics.tpot is None and metrics.itl == []


def test_summary_uses_vllm_names_and_formulas():
    """Three requests worked out by hand (ms): TTFT 1000/500/100, TPOT 1000/500/300, E2EL 3000/1000/1000,
    ITL 1000,1000 / 500 / 300,200,400; a fourth that produced nothing is not completed and not counted."""
    requests = [
        RequestMetrics.from_timestamps(0.0, [1.0, 2.0, 3.0], prompt_tokens=10),
        RequestMetrics.from_timestamps(1.0, [1.5, 2.0], prompt_tokens=6),
        RequestMetrics.from_timestamps(2.0, [2.1, 2.4, 2.6, 3.0], prompt_tokens=4),
        RequestMetrics.from_timestamps(2.5, [], prompt_tokens=50),
    ]
    summary = summarize(requests, duration=4.0)
    assert summary["completed"] == 3
    assert (summary["total_input_tokens"], summary["total_output_tokens"]) == (20, 9)
    assert summary["request_throughput"] == pytest.approx(0.75)
    assert summary["output_throughput"] == pytest.approx(2.25)
    assert summary["total_token_throughput"] == pytest.approx(7.25)
    assert summary["mean_ttft_ms"] == pytest.approx(533.333, abs=1e-3)
    assert summary["median_ttft_ms"] == pytest.approx(500.0)
    assert summary["p90_ttft_ms"] == pytest.approx(900.0)  # 500 + 0.8 * (1000 - 500)
    assert summary["p99_ttft_ms"] == pytest.approx(990.0)
    assert summary["mean_tpot_ms"] == pytest.approx(600.0)
    assert summary["median_tpot_ms"] == pytest.approx(500.0)
    assert summary["mean_itl_ms"] == pytest.approx(566.667, abs=1e-3)
    assert summary["median_itl_ms"] == pytest.approx(450.0)  # between 400 and 500 of 200,300,400,500,1000,1000
    assert summary["p99_itl_ms"] == pytest.approx(1000.0)
    assert summary["mean_e2el_ms"] == pytest.approx(1666.667, abs=1e-3)
    assert summary["median_e2el_ms"] == pytest.approx(1000.0)


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
    assert percentile([], 50) == 0.0


def test_detokenizer_streams_multibyte_text_without_broken_characters(tiny_chat_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_dir)
    text = "héllo wörld, naïve café — ünïcode ✓ done"
    ids = tokenizer.encode(text)
    detokenizer = IncrementalDetokenizer(tokenizer, [], ())
    deltas = [detokenizer.add([token])[0] for token in ids]
    deltas.append(detokenizer.flush())
    assert "".join(deltas) == tokenizer.decode(ids)
    assert not any("\ufffd" in delta for delta in deltas)


def test_detokenizer_holds_back_a_possible_stop_string(tiny_chat_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_dir)
    ids = tokenizer.encode("return a + b and more")
    detokenizer = IncrementalDetokenizer(tokenizer, [], ("a + b",))
    shown = ""
    for token in ids:
        delta, stopped = detokenizer.add([token])
        shown += delta
        assert "a +" not in shown
        if stopped:
            break
    assert stopped and shown == "return "


def test_goodput_counts_the_requests_that_met_every_objective_like_vllm():
    """The requests of the summary test above: TTFT 1000/500/100 ms, TPOT 1000/500/300 ms, E2EL 3000/1000/1000 ms,
    plus a single-token one (TTFT 200 ms, no TPOT: vLLM counts its TPOT as 0, so a TPOT objective passes it)."""
    requests = [
        RequestMetrics.from_timestamps(0.0, [1.0, 2.0, 3.0], prompt_tokens=10),
        RequestMetrics.from_timestamps(1.0, [1.5, 2.0], prompt_tokens=6),
        RequestMetrics.from_timestamps(2.0, [2.1, 2.4, 2.6, 3.0], prompt_tokens=4),
        RequestMetrics.from_timestamps(3.0, [3.2], prompt_tokens=4),
    ]
    assert summarize(requests, duration=4.0)["request_goodput"] is None
    assert summarize(requests, 4.0, {"ttft": 500})["request_goodput"] == pytest.approx(3 / 4)  # 500 ms is good
    assert summarize(requests, 4.0, {"tpot": 400})["request_goodput"] == pytest.approx(2 / 4)
    assert summarize(requests, 4.0, {"ttft": 500, "tpot": 400})["request_goodput"] == pytest.approx(2 / 4)
    assert summarize(requests, 4.0, {"e2el": 999.0})["request_goodput"] == pytest.approx(1 / 4)
    assert summarize(requests, 4.0, {"ttft": 1e9, "tpot": 1e9, "e2el": 1e9})["request_goodput"] == \
        pytest.approx(summarize(requests, 4.0)["request_throughput"])


@pytest.mark.parametrize("slos", [{"itl": 5.0}, {"ttft": 0}, {"tpot": -1.0}, {"e2el": float("inf")}, {"ttft": "5"}])
def test_bad_goodput_objectives_are_refused(slos):
    from engine import ConfigError

    with pytest.raises(ConfigError, match="goodput objective"):
        summarize([], 1.0, slos)
