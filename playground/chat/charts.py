"""The live charts beside the chat, for one session: what each of them shows now, and the perplexity button.

Why a class of its own: the charts are refreshed while a reply streams (the chat's handlers), on the
page's timer and when the page loads, always the same way: from the engine serving the session's
configuration (if it is loaded) and the session's own turns and activity. The data and markup come
from `playground/figures/` (pure functions of what the engine reports); this decides which engine,
which window and what Gradio gets.
"""

from __future__ import annotations

import time

import gradio as gr
import psutil

from engine import EngineError, EngineInfo, EngineStats
from playground.figures import live_charts
from playground.figures.configuration import config_summary, config_tag
from playground.figures.features import features_html, unquantized_weights_bytes
from playground.shared.context import PlaygroundContext
from playground.shared.errors import Refused
from playground.shared.session import Session

CHART_NAMES = ("ttft_chart", "throughput", "memory_chart", "kv_blocks", "batch", "spec_chart", "features")
PERPLEXITY_PROGRESS = gr.Progress()  # Gradio shows a progress bar for a handler whose default is a gr.Progress


def ttft_chart(session: Session) -> str:
    """The TTFT chart of this session's replies (every reply since the tab opened, cleared chats included)."""
    rows = []
    for number, exchange in enumerate(session.turns, start=1):
        figures = exchange.figures
        rows.append({"number": number, "config": exchange.config, "engine_ttft_ms": figures.get("engine_ttft_ms"),
                     "measured_at": figures.get("measured_at"),
                     "first_text_ms": figures.get("first_text_ms"), "visible_ttft_ms": exchange.visible_ttft_ms,
                     "prompt_tokens": figures.get("prompt_tokens") or 0,
                     "cached_tokens": figures.get("cached_tokens") or 0})
    return live_charts.ttft_html(rows)


class LiveCharts:
    """The charts of a session, over the context's pool."""

    def __init__(self, context: PlaygroundContext):
        self.context = context

    def outputs(self, session: Session, engine=None) -> tuple:
        """The charts in CHART_NAMES order, from `engine` (by default the one serving this session, if it is
        loaded) and the session itself."""
        if engine is None:
            with self.context.pool.lease_if_loaded(session.config) as entry:
                return self._charts(session, entry.engine if entry else None)
        return self._charts(session, engine)

    def _charts(self, session: Session, engine) -> tuple:
        now = time.perf_counter()
        steps, stats, info = [], None, None
        if engine is not None:
            steps = engine.step_history(since=now - live_charts.WINDOW_S)
            stats, info = engine.stats(), engine.info
            session.kv_samples = live_charts.kv_samples_with(session.kv_samples, stats, now, session.config)
        else:
            session.kv_samples = []
        session.activity.trim(now, live_charts.WINDOW_S)
        frames = {
            live_charts.THROUGHPUT.name: live_charts.throughput_frame(steps, session.activity, now),
            live_charts.KV_BLOCKS.name: live_charts.kv_blocks_frame(session.kv_samples, now),
            live_charts.BATCH.name: live_charts.batch_frame(steps, session.activity, now),
            live_charts.SPECULATIVE.name: live_charts.speculative_frame(steps, now),
        }
        titles = {live_charts.KV_BLOCKS.name: live_charts.kv_blocks_label(session.kv_samples),
                  live_charts.SPECULATIVE.name: live_charts.speculative_label(steps)}
        label = config_tag(session.config)
        plots = {spec.name: live_charts.line_chart_html(spec, frames[spec.name], titles.get(spec.name), label)
                 for spec in live_charts.LINE_CHARTS}
        # the acceptance chart shows only while this configuration speculates
        plots[live_charts.SPECULATIVE.name] = gr.HTML(plots[live_charts.SPECULATIVE.name],
                                                      visible=session.config.speculative != "off")
        rss = psutil.Process().memory_info().rss
        return (ttft_chart(session), plots[live_charts.THROUGHPUT.name],
                live_charts.memory_html(stats, rss, config_summary(session.config, info),
                                        info.device if info and info.backend == "remote" else None),
                plots[live_charts.KV_BLOCKS.name], plots[live_charts.BATCH.name],
                plots[live_charts.SPECULATIVE.name], self._features(session, engine, stats, info))

    def _features(self, session: Session, engine, stats: EngineStats | None, info: EngineInfo | None,
                  status: str | None = None) -> str:
        """The quality-and-optimizations panel of the engine serving this session (None: not loaded)."""
        perplexity = engine.held_out_perplexity if engine is not None else None
        if perplexity is None and status is None and engine is not None and engine.tokenizer is None:
            status = "n/a: this model has no tokenizer, and perplexity is measured on text"
        config = session.config
        unquantized = unquantized_weights_bytes(config) if config.quantization != "none" else None
        return features_html(config, stats, info, perplexity, unquantized, status,
                             self.context.references.cached(config.model))

    def measure_perplexity(self, session, progress=PERPLEXITY_PROGRESS) -> str:
        """Measure the held-out perplexity of the engine serving this session (once per engine; cached), and the
        model's float32 reference (once per model), with a progress bar; requests keep being served meanwhile."""
        session = self.context.session_of(session)
        with self.context.pool.lease_if_loaded(session.config) as entry:
            if entry is None:
                return features_html(None, None, None, None, None)
            engine = entry.engine
            status = None
            try:
                with self.context.measurements.held(session):  # measuring: one measurement at a time
                    engine.perplexity(progress=lambda done, total: progress(done / total,
                                                                            desc="scoring held-out text"))
                    self.context.references.measure(session.config, lambda done, total: progress(
                        done / total, desc="scoring it in float32 once, for the reference"))
            except (EngineError, Refused) as error:
                status = f"could not be measured: {self.context.describe(error)}"
            return self._features(session, engine, engine.stats(), engine.info, status)
