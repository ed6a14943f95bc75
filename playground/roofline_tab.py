"""The Roofline tab: the active configuration's prefill and decode steps against the device's measured limits.

Why a tab of its own: "profile first" is the advice every optimization here starts from, and the
roofline answers the question behind it (is this phase starved of bandwidth or of arithmetic, and
how far from the hardware is it?) with numbers measured on this machine. The tab reads the steps
the engine recorded (chat turns, API calls, other sessions on the same engine) or runs a short probe
of its own (one, then several, then many sequences at once, so decode shows at several batch sizes);
the ceilings are measured the first time and read from a cache file afterwards (`engine.roofline`).
`/roofline` serves API clients the same report as plain data.
"""

from __future__ import annotations

import html
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gradio as gr

from engine import EngineError, SamplingParams, device_ceilings, engine_roofline
from playground.errors import Refused, describe_error
from playground.figures import config_summary
from playground.roofline_chart import roofline_summary_html, roofline_svg

if TYPE_CHECKING:
    from playground.handlers import Playground

PROBE, LAST_MINUTE, EVERYTHING = "the probe's steps", "the last 60 s", "every recorded step"
WINDOWS = (PROBE, LAST_MINUTE, EVERYTHING)
PROBE_BATCHES = (1, 4, 16)
PROBE_INPUT_LEN = 128
PROBE_OUTPUT_LEN = 32
PROBE_SEED = 0
OUTPUTS = ("rl_chart", "rl_summary", "rl_report", "rl_probe_started", "rl_window")
# element id -> glossary term, for the tooltips (the chat tab's Measure perplexity button included)
TOOLTIPS = {"rl-window": "roofline_window", "rl-probe": "roofline_probe", "rl-remeasure": "roofline_remeasure",
            "rl-chart": "ceilings", "measure-ppl": "measure_perplexity"}
INTRO = ("**Roofline**: where this configuration's steps sit against the limits of this device. A step that "
         "reads more bytes than it does arithmetic per byte (decode: every weight for one token per sequence) is "
         "limited by memory bandwidth (the slope); one with enough arithmetic per byte (a long prefill) by the "
         "matmul peak (the flat roof). FLOPs and bytes are counted from the model's shapes and each step's batch "
         "(weights read once per step at their real, quantized if so, size; K/V read and written; attention's "
         "query-key pairs); the ceilings are measured on this machine once and cached. **Run probe** sends a "
         "short workload to the active engine (1, then 4, then 16 sequences of 128 prompt tokens, 32 out).")


@dataclass
class RooflineView:
    """What the tab shows, the report as plain data (the API's answer), or why there is none."""

    chart: str
    summary: str
    report: dict | None
    reason: str | None = None

    @classmethod
    def unavailable(cls, reason: str) -> RooflineView:
        return cls(roofline_svg(None), roofline_summary_html(None, reason), None, reason)


def probe_prompts(count: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    """`count` prompts of `length` random token ids (a fixed seed: the same probe every time)."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(length)] for _ in range(count)]


def run_probe(engine) -> float:
    """The probe's requests, batch after batch, on `engine`; returns when it started (a perf_counter time)."""
    started = time.perf_counter()
    length = min(PROBE_INPUT_LEN, engine.info.max_model_len - PROBE_OUTPUT_LEN - 1)
    for index, batch in enumerate(PROBE_BATCHES):
        prompts = probe_prompts(batch, length, engine.info.vocab_size, PROBE_SEED + index)
        engine.generate(prompts, SamplingParams(max_tokens=PROBE_OUTPUT_LEN, ignore_eos=True))
    return started


def roofline_view(engine, since: float, title: str = "", refresh: bool = False) -> RooflineView:
    """The chart, the words and the table of `engine`'s steps after `since`; the reason where it cannot tell."""
    try:
        report = engine_roofline(engine, since, refresh=refresh)
    except ValueError as error:
        return RooflineView.unavailable(str(error))
    heading = f'<div class="rl-config">{html.escape(title)}</div>' if title else ""
    return RooflineView(heading + roofline_svg(report), roofline_summary_html(report), report.to_dict())


class RooflineTab:
    """The tab's handlers: show the recorded steps, run the probe, measure the ceilings again."""

    def __init__(self, app: Playground):
        self.app = app

    @staticmethod
    def _since(window: str, probe_started: float) -> float:
        if window == LAST_MINUTE:
            return time.perf_counter() - 60.0
        if window == PROBE:
            return probe_started
        return 0.0

    def _view(self, session, window: str, probe_started: float, refresh: bool = False) -> RooflineView:
        with self.app.pool.lease_if_loaded(session.config) as entry:
            if entry is None:
                return RooflineView.unavailable("The engine of the active configuration is not loaded yet: press "
                                                "Apply, send a chat message, or Run probe.")
            engine = entry.engine
            if refresh:
                device_ceilings(engine.info.device, engine.info.dtype, refresh=True)
            return roofline_view(engine, self._since(window, probe_started), config_summary(session.config,
                                                                                            engine.info))

    def _probe(self, session) -> tuple[RooflineView, float]:
        try:
            with self.app.pool.lease(session.config) as entry:
                started = run_probe(entry.engine)
                title = config_summary(session.config, entry.engine.info)
                return roofline_view(entry.engine, started, title), started
        except (EngineError, Refused) as error:
            return RooflineView.unavailable(f"The probe could not run: "
                                            f"{describe_error(error, self.app.settings.public)}"), 0.0

    @staticmethod
    def _outputs(view: RooflineView, probe_started: float, window: str) -> tuple:
        return view.chart, view.summary, view.report, probe_started, window

    @staticmethod
    def _window(window, probe_started) -> tuple[str, float]:
        started = float(probe_started) if isinstance(probe_started, float | int) and probe_started > 0 else 0.0
        if window not in WINDOWS or (window == PROBE and not started):
            window = EVERYTHING
        return window, started

    def show(self, window, probe_started, session) -> tuple:
        """The steps of the window on the engine of this session's configuration, if it is loaded."""
        window, started = self._window(window, probe_started)
        return self._outputs(self._view(self.app.session_of(session), window, started), started, window)

    def remeasure(self, window, probe_started, session) -> tuple:
        """Measure the device's ceilings again (overwriting the cache), then show the window."""
        window, started = self._window(window, probe_started)
        return self._outputs(self._view(self.app.session_of(session), window, started, refresh=True), started,
                             window)

    def probe(self, session) -> tuple:
        """Load the active configuration if needed, run the probe on it, and show the probe's steps."""
        view, started = self._probe(self.app.session_of(session))
        return self._outputs(view, started, PROBE if started else EVERYTHING)

    def api_roofline(self, probe, session) -> dict:
        """`/roofline`: the report (after running the probe when `probe` is true) as plain data."""
        session = self.app.session_of(session)
        view = self._probe(session)[0] if probe is True else self._view(session, EVERYTHING, 0.0)
        if view.report is None:
            raise gr.Error(view.reason or "no roofline", print_exception=False)
        return view.report


def build_roofline_tab(app: Playground, ui: dict) -> RooflineTab:
    """The tab's components, added to `ui` by name (call inside `with gr.Tab(...)`)."""
    gr.Markdown(INTRO, elem_id="rl-intro")
    with gr.Row(elem_id="rl-controls"):
        ui["rl_window"] = gr.Radio(list(WINDOWS), value=EVERYTHING, label="steps to place", elem_id="rl-window",
                                   info="the probe's, the last minute's, or every step the engine recorded (all "
                                        "sessions on this engine; up to the last 4096)")
        ui["rl_probe"] = gr.Button("Run probe", variant="primary", elem_id="rl-probe", scale=0, min_width=120)
        ui["rl_show"] = gr.Button("Refresh", elem_id="rl-show", scale=0, min_width=100)
        ui["rl_remeasure"] = gr.Button("Measure ceilings again", elem_id="rl-remeasure", scale=0, min_width=160)
    ui["rl_chart"] = gr.HTML(roofline_svg(None), elem_id="rl-chart", elem_classes=["chart-html"])
    ui["rl_summary"] = gr.HTML(roofline_summary_html(None, "Run probe, or Refresh after chatting."),
                               elem_id="rl-summary")
    ui["rl_report"] = gr.JSON(visible=False, label="roofline report")
    ui["rl_probe_started"] = gr.State(0.0)
    return RooflineTab(app)


def wire_roofline_tab(tab: RooflineTab, ui: dict, session) -> None:
    """The tab's events. The probe shares the "measure" slot with the other measuring tabs (one at a time)."""
    outputs = [ui[name] for name in OUTPUTS]
    state = [ui["rl_window"], ui["rl_probe_started"], session]
    private = {"api_visibility": "private", "show_progress": "minimal"}
    ui["rl_probe"].click(tab.probe, [session], outputs, concurrency_limit=1, concurrency_id="measure", **private)
    ui["rl_show"].click(tab.show, state, outputs, **private)
    ui["rl_window"].input(tab.show, state, outputs, **private)
    ui["rl_remeasure"].click(tab.remeasure, state, outputs, concurrency_limit=1, concurrency_id="measure", **private)
    with gr.Group(visible=False):
        probe, report, button = gr.Checkbox(label="probe"), gr.JSON(label="roofline"), gr.Button("roofline")
    button.click(tab.api_roofline, [probe, session], report, api_name="roofline", concurrency_limit=1,
                 concurrency_id="measure")
