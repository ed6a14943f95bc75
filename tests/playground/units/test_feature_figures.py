"""The chat tab's feature figures: speculative acceptance (live chart, per reply), perplexity beside the weights
before and after quantization, and tensor parallelism's communication share, each against the engine's own figures."""

from __future__ import annotations

import dataclasses
import re
import time

import pytest

from engine import Engine, EngineConfig, EngineStats, RequestMetrics, SamplingParams, StepRecord, estimate_memory
from engine.pipeline_stats import PipelineStats, Span
from playground.app import create_playground
from playground.figures import live_charts
from playground.figures.features import disaggregation_rows, features_html, pipeline_rows, tensor_parallel_rows
from playground.figures.replies import figures_html, reply_figures
from playground.page import PageHandlers
from playground.shared.settings import Settings
from tests.support.reference_figures import engine_info

REPEATING_PROMPT = [5, 6, 7, 8, 9] * 6


def _step(at: float, proposed: int, accepted: int, sequences: int = 1) -> StepRecord:
    return StepRecord(time=at, duration=0.01, batch_size=sequences, num_tokens=sequences + proposed,
                      num_decode_tokens=sequences + proposed, num_running=sequences, kv_blocks_used=1,
                      num_output_tokens=sequences + accepted, spec_proposed=proposed, spec_accepted=accepted)


def test_reply_figure_shows_accepted_of_proposed_and_tokens_per_step():
    metrics = RequestMetrics.from_timestamps(arrival=0.0, token_times=[0.1, 0.2, 0.3], prompt_tokens=4,
                                             spec_proposed=8, spec_accepted=6, spec_drafts=4)
    figures = reply_figures(metrics, speculative=True)
    assert (figures["spec_accepted"], figures["spec_proposed"], figures["spec_tokens_per_step"]) == (6, 8, 2.5)
    assert "75% (6/8) · 2.50 tok/step" in figures_html(figures)
    assert "spec accept" not in figures_html(reply_figures(metrics, speculative=False))


def test_acceptance_chart_bins_accepted_over_proposed_and_skips_bins_without_proposals():
    now = 1000.0
    steps = [_step(now - 10.5, 4, 3), _step(now - 10.2, 4, 1), _step(now - 5.5, 0, 0), _step(now - 2.5, 8, 8, 2)]
    frame = live_charts.speculative_frame(steps, now)
    assert list(frame["acceptance"]) == [0.5, 1.0]  # (3 + 1) / 8, then 8 / 8; the bin without proposals is absent
    assert list(frame["time_s"]) == [-10.0, -2.0]
    # tokens per verification step: (4 + 2 + 10 output tokens) / (1 + 1 + 2 verifying sequences)
    assert "4.00 tokens per verification step" in live_charts.speculative_label(steps)
    assert live_charts.speculative_frame([_step(now - 1, 0, 0)], now).empty


@pytest.fixture(scope="module")
def ngram_app(tiny_llama_dir):
    context = create_playground(Settings(), default_model=tiny_llama_dir, models={})
    yield PageHandlers(context)
    context.pool.close()


def test_acceptance_chart_matches_engine_stats_and_shows_only_while_speculating(ngram_app, tiny_llama_dir):
    app = ngram_app
    session = app.context.new_session()
    off = app.charts.outputs(session)
    assert off[5].visible is False and "engine not loaded" in off[6]
    session.config = EngineConfig(model=tiny_llama_dir, speculative="ngram", num_speculative_tokens=3)
    with app.context.pool.lease(session.config) as entry:
        engine = entry.engine
        since = time.perf_counter()
        engine.generate([REPEATING_PROMPT, REPEATING_PROMPT[1:]], SamplingParams(max_tokens=24, ignore_eos=True))
        stats = engine.stats()
        steps = engine.step_history(since)
    assert stats.spec_num_draft_tokens > 0, "n-gram lookup proposes on a repeating prompt"
    outputs = app.charts.outputs(session)
    assert outputs[5].visible is True
    frame = live_charts.speculative_frame(steps, time.perf_counter())
    assert sum(step.spec_proposed for step in steps) == stats.spec_num_draft_tokens
    assert sum(step.spec_accepted for step in steps) == stats.spec_num_accepted_tokens
    assert not frame.empty and frame["acceptance"].between(0, 1).all()
    panel = outputs[6]
    accepted, proposed = stats.spec_num_accepted_tokens, stats.spec_num_draft_tokens
    assert f"({accepted:,} of {proposed:,} proposed)" in panel
    assert f"{1 + accepted / stats.spec_num_drafts:.2f} tokens per verification step" in panel


def test_panel_shows_perplexity_once_measured_and_quantized_weights_against_unquantized(ngram_app):
    app = ngram_app
    session = app.context.new_session()
    session.config = EngineConfig(model="demo", quantization="torchao-int8")
    with app.context.pool.lease(session.config) as entry:
        engine = entry.engine
        before = app.charts.outputs(session)[6]
        assert "not measured yet" in before
        panel = app.charts.measure_perplexity(session, progress=lambda *args, **kwargs: None)
        stats = engine.stats()
    expected_ppl = engine.held_out_perplexity.perplexity
    assert f"{expected_ppl:.3f} on" in panel
    reference = app.context.references.cached("demo").perplexity  # the float32 demo, measured once beside it
    assert f"float32 reference {reference:.3f} ({expected_ppl / reference:.2f}x)" in panel
    unquantized = estimate_memory(EngineConfig(model="demo")).weights_bytes
    ratio = float(re.search(r"as torchao-int8 \(([\d.]+)x\)", panel).group(1))
    assert ratio == pytest.approx(stats.weights_bytes / unquantized, abs=0.005) and ratio < 0.6
    assert "as torchao-int8" in panel


def test_tensor_parallel_rows_give_each_rank_its_share():
    stats = EngineStats(tensor_parallel_size=2, executor_seconds=4.0, collective_seconds=1.0, collective_share=0.25,
                        rank_weights_bytes=(1024, 2048), rank_kv_cache_bytes=(4096, 4096),
                        rank_collective_seconds=(1.0, 2.0), weights_bytes=1)
    rows = "".join(tensor_parallel_rows(stats))
    assert "25% of step time" in rows and "collectives 1.00 s (25%)" in rows and "collectives 2.00 s (50%)" in rows
    config = EngineConfig(model="demo")
    info = engine_info()
    assert "TP communication" in features_html(config.replace(tensor_parallel_size=2), stats, info, None, None)
    assert "TP communication" not in features_html(config, dataclasses.replace(stats, tensor_parallel_size=1), info,
                                                   None, None)


def test_pipeline_rows_show_the_bubble_each_stage_and_a_timeline():
    timeline = (Span(0, 0, 0.0, 1.0), Span(1, 0, 1.0, 2.0), Span(0, 1, 1.0, 2.0), Span(1, 1, 2.0, 3.0))
    pipeline = PipelineStats(stages=2, micro_batches=2, schedule="flush", micro_batches_run=2, active_seconds=3.0,
                             stage_busy_seconds=(2.0, 2.0), bytes_between_stages=4096, timeline=timeline)
    rows = "".join(pipeline_rows(EngineStats(pipeline_parallel_size=2, pipeline=pipeline)))
    assert "33% measured · 33% textbook" in rows  # 2 s idle of 6 stage-seconds; (2-1)/(2+2-1)
    assert "busy 2.00 s · idle 1.00 s" in rows and "4.0 KiB" in rows
    assert rows.count('class="busy"') == 4 and "micro-batch 1" in rows
    idle = dataclasses.replace(pipeline, micro_batches_run=0, timeline=())
    assert "no micro-batch has run yet" in "".join(pipeline_rows(EngineStats(pipeline_parallel_size=2,
                                                                             pipeline=idle)))
    config = EngineConfig(model="demo")
    stats = EngineStats(pipeline_parallel_size=2, pipeline=pipeline, weights_bytes=1)
    assert "pipeline bubble" in features_html(config, stats, engine_info(), None, None)


def test_disaggregation_rows_show_each_worker_and_the_moves():
    stats = EngineStats(disaggregation="prefill-decode", worker_roles=("prefill worker", "decode worker"),
                        worker_utilisation=(0.25, 0.9), worker_busy_seconds=(1.0, 3.6), worker_steps=(4, 40),
                        worker_prefill_chunks=(4, 0), worker_decode_rows=(0, 120), worker_requests=(0, 3),
                        kv_transfers=3, kv_transfer_bytes=3 << 20, kv_transfer_seconds=0.006,
                        kv_transfer_bytes_per_request=1 << 20, kv_transfer_seconds_per_request=0.002, weights_bytes=1)
    rows = "".join(disaggregation_rows(stats))
    assert "prefill worker" in rows and "25% busy (1.00 s) · 4 prompt chunks" in rows
    assert "90% busy (3.60 s) · 0 prompt chunks · 120 decode rows · 3 request(s) now" in rows
    assert "3 moves · 3.0 MiB in 6.0 ms · per request 1.0 MiB, 2.00 ms" in rows
    none_moved = dataclasses.replace(stats, kv_transfers=0)
    assert "no prompt has moved" in "".join(disaggregation_rows(none_moved))
    config = EngineConfig(model="demo")
    assert "K/V moved" in features_html(config, stats, engine_info(), None, None)
    assert "K/V moved" not in features_html(config, dataclasses.replace(stats, disaggregation="off"), engine_info(),
                                            None, None)


@pytest.mark.slow
def test_tensor_parallel_engine_reports_communication_in_the_panel(tiny_llama_dir):
    with Engine(EngineConfig(model=tiny_llama_dir, tensor_parallel_size=2)) as engine:
        engine.generate([[3, 4, 5]], SamplingParams(max_tokens=4, ignore_eos=True))
        stats = engine.stats()
    panel = features_html(engine.config, stats, engine.info, None, None)
    assert f"{stats.collective_share:.0%} of step time" in panel and "rank 1" in panel
