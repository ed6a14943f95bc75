"""The chat's figures and live charts from hand-made engine records: reply chips, configuration summaries,
engine-wide charts with this session apart, memory and TTFT."""

from __future__ import annotations

import pytest

from engine import EngineStats, RequestMetrics, StepRecord
from playground.figures import live_charts
from playground.figures.replies import figures_html, reply_figures
from playground.figures.svg_lines import nice_top
from playground.shared.activity import SessionActivity


def test_reply_figures_follow_the_metric_definitions():
    metrics = RequestMetrics.from_timestamps(arrival=10.0, token_times=[10.2, 10.3, 10.4, 10.6], prompt_tokens=12,
                                             cached_tokens=8, spec_proposed=10, spec_accepted=7)
    figures = reply_figures(metrics, speculative=True)
    assert figures["engine_ttft_ms"] == pytest.approx(200.0)
    assert figures["decode_tokens_per_s"] == pytest.approx(3 / 0.4, rel=1e-3)
    assert (figures["prompt_tokens"], figures["output_tokens"], figures["cached_tokens"]) == (12, 4, 8)
    assert figures["spec_acceptance"] == 0.7
    chips = figures_html({**figures, "visible_ttft_ms": 850.0}, "cancelled", dropped_turns=2)
    assert "engine TTFT" in chips and "200 ms" in chips and "Enter → text" in chips and "850 ms" in chips
    assert "stopped" in chips and "2 older turns left out" in chips and "8 cached" in chips


def test_engine_wide_charts_draw_this_sessions_requests_apart():
    now = 100.0
    steps = [StepRecord(99.5, 0.1, batch_size=2, num_tokens=30, num_decode_tokens=2, num_running=2, kv_blocks_used=4),
             StepRecord(99.7, 0.1, batch_size=3, num_tokens=3, num_decode_tokens=3, num_running=3, kv_blocks_used=5),
             StepRecord(10.0, 0.1, batch_size=9, num_tokens=9, num_decode_tokens=9, num_running=9,
                        kv_blocks_used=9)]  # outside the window
    activity = SessionActivity()
    activity.request_started(99.2)
    activity.tokens_arrived(99.6, 2)
    frame = live_charts.throughput_frame(steps, activity, now)
    last = frame[frame["time_s"] == 0.0].set_index("series")["tokens_per_s"]
    active = 0.2  # two steps of 0.1 s, a gap of ACTIVE_GAP_S apart (not under it): two spans in the last second
    assert last["prefill (all)"] == pytest.approx(28 / active) and last["decode (all)"] == pytest.approx(5 / active)
    assert last["this session"] == pytest.approx(2 / 0.8), "its request ran from 99.2 to now"
    batch = live_charts.batch_frame(steps, activity, now)
    latest = batch[batch["time_s"] == 0.0].set_index("series")["sequences"]
    assert latest["running (all)"] == 3 and latest["this session"] == 1
    assert batch[batch["series"] == "this session"]["sequences"].sum() == 1  # the request began in the last bin
    assert "all sessions on this engine" in live_charts.THROUGHPUT.title
    drawn = live_charts.line_chart_html(live_charts.BATCH, batch, engine_label="demo · nf4 · GQA 4")
    assert 'data-series="running (all)"' in drawn and 'data-series="this session"' in drawn
    assert '<div class="hchart-subtitle">engine: demo · nf4 · GQA 4</div>' in drawn


def test_axis_tops_are_round_and_never_an_empty_range():
    assert nice_top(12.2, integer=True) == 20 and nice_top(3.0, integer=True) == 4
    assert nice_top(0.0, integer=False) == 1.0 and nice_top(0.37, integer=False) == 0.4


def test_a_sub_second_reply_plots_its_own_rate_over_the_named_window_not_its_token_count():
    """60 tokens in 0.6 s (the issue's chips said 104 tok/s while one-second bins plotted about 60)."""
    now, first = 100.0, 99.15
    steps = [StepRecord(first, 0.05, batch_size=1, num_tokens=17, num_decode_tokens=1, num_running=1,
                        kv_blocks_used=2)]
    steps += [StepRecord(first + 0.01 * i, 0.01, batch_size=1, num_tokens=1, num_decode_tokens=1, num_running=1,
                         kv_blocks_used=2) for i in range(1, 60)]
    activity = SessionActivity()
    activity.request_started(first - 0.05)
    for step in steps:
        activity.tokens_arrived(step.time, 1)
    activity.request_ended(steps[-1].time)
    frame = live_charts.throughput_frame(steps, activity, now)
    peak = frame.groupby("series")["tokens_per_s"].max()
    assert peak["decode (all)"] == pytest.approx(60 / 0.64, rel=0.05)  # from the prefill's start to the last step
    assert peak["this session"] == pytest.approx(60 / 0.64, rel=0.05)
    assert frame[frame["time_s"] < -2]["tokens_per_s"].eq(0).all(), "no rate where nothing was active"
    times = frame[frame["series"] == "decode (all)"]["time_s"]
    assert set(times.diff().dropna().round(6)) == {live_charts.RATE_STEP_S} and times.max() == 0.0
    assert "1 s sliding window" in live_charts.THROUGHPUT.title


def test_memory_chart_shows_each_figure_of_this_engine_and_the_process_apart():
    stats = EngineStats(weights_bytes=26 * 2**20, kv_cache_bytes=384 * 2**20, kv_cache_used_bytes=96 * 2**10,
                        kv_blocks_total=2048, kv_blocks_free=2047, peak_memory_bytes=900 * 2**20)
    shown = live_charts.memory_html(stats, 850 * 2**20, "demo · native")
    assert "26.0 MiB" in shown and "384.0 MiB" in shown and "96.0 KiB" in shown and "1 of 2048 blocks" in shown
    assert "width:1.00%" in shown, "a few KV blocks in use must still draw a visible bar"
    assert "process (every engine in the pool + the app): peak 900.0 MiB" in shown


def test_ttft_chart_labels_each_bar_with_its_configuration_and_prompt():
    rows = [{"number": 1, "config": "demo · native · paged/16+prefix · continuous ×32", "engine_ttft_ms": 40.0,
             "first_text_ms": 55.0, "visible_ttft_ms": 300.0, "prompt_tokens": 412, "cached_tokens": 380}]
    shown = live_charts.ttft_html(rows)
    assert "paged/16+prefix" in shown and "prompt 412 tok (380 cached)" in shown
    assert "40 ms engine" in shown and "300 ms to text" in shown


def test_a_structured_replys_mask_work_per_token_and_its_share_of_tpot():
    metrics = RequestMetrics.from_timestamps(arrival=10.0, token_times=[10.2, 10.3, 10.4, 10.5], prompt_tokens=12)
    metrics.guided_mask_s, metrics.guided_compile_s = 0.008, 0.0125  # 2 ms of mask work per token, TPOT 100 ms
    figures = reply_figures(metrics, speculative=False, guided=True)
    assert figures["guided_mask_ms"] == pytest.approx(2.0) and figures["guided_mask_share"] == pytest.approx(0.02)
    assert figures["guided_compile_ms"] == 12.5
    chips = figures_html(figures, "stop")
    assert "guided mask" in chips and "2.000 ms/tok · 2.0% of TPOT" in chips and "12 ms" in chips
    assert "guided_mask_ms" not in reply_figures(metrics, speculative=False), "no mask chip without structured output"
    first = reply_figures(RequestMetrics.from_timestamps(10.0, [10.2], 12), speculative=False, guided=True)
    assert first["guided_mask_share"] is None and "0.000 ms/tok" in figures_html(first) and "of TPOT" not in \
        figures_html(first), "one token: no TPOT, so no share of it"
    assert "n/a" in figures_html(reply_figures(None, speculative=False, guided=True))
