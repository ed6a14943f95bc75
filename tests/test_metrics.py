"""Metric formulas on synthetic timestamps, the detokenizer on tricky text, and the sampler's filters."""

from __future__ import annotations

import pytest

from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.metrics import RequestMetrics, percentile, summarize


def test_request_metrics_follow_the_definitions():
    metrics = RequestMetrics.from_timestamps(10.0, [10.5, 10.7, 11.0, 11.6], prompt_tokens=20, cached_tokens=16)
    assert metrics.ttft == pytest.approx(0.5)
    assert metrics.e2el == pytest.approx(1.6)
    assert metrics.tpot == pytest.approx((1.6 - 0.5) / 3)
    assert metrics.itl == pytest.approx([0.2, 0.3, 0.6])
    assert metrics.output_tokens == 4 and metrics.cached_tokens == 16
    running = RequestMetrics.from_timestamps(10.0, [10.5, 10.7, 11.0, 11.6], prompt_tokens=20, with_itl=False)
    assert running.itl == [] and running.tpot == metrics.tpot and running.ttft == metrics.ttft


def test_single_token_request_has_no_tpot():
    metrics = RequestMetrics.from_timestamps(0.0, [0.25], prompt_tokens=3)
    assert metrics.ttft == metrics.e2el == 0.25
    assert metrics.tpot is None and metrics.itl == []


def test_summary_uses_vllm_names_and_formulas():
    first = RequestMetrics.from_timestamps(0.0, [1.0, 2.0, 3.0], prompt_tokens=10)
    second = RequestMetrics.from_timestamps(1.0, [1.5, 2.0], prompt_tokens=6)
    summary = summarize([first, second], duration=4.0)
    assert summary["completed"] == 2
    assert summary["request_throughput"] == pytest.approx(0.5)
    assert summary["output_throughput"] == pytest.approx(5 / 4)
    assert summary["total_token_throughput"] == pytest.approx(21 / 4)
    assert summary["mean_ttft_ms"] == pytest.approx(750.0)
    assert summary["median_tpot_ms"] == pytest.approx(750.0)
    assert summary["p99_itl_ms"] == pytest.approx(percentile([1000.0, 1000.0, 500.0], 99))
    assert summary["mean_e2el_ms"] == pytest.approx(2000.0)


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
