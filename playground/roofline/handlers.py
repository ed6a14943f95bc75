"""The Roofline tab's handlers: the active configuration's prefill and decode steps against the device's measured
limits, from the steps the engine recorded or from the probe's (`roofline/probe.py`).

Why a tab of its own: "profile first" is the advice every optimization here starts from, and the
roofline answers the question behind it (is this phase starved of bandwidth or of arithmetic, and
how far from the hardware is it?) with numbers measured on this machine. The tab reads the steps
the engine recorded (chat turns, API calls, other sessions on the same engine) or runs a short probe
of its own (one, then several, then many sequences at once, so decode shows at several batch sizes);
the ceilings are measured the first time and read from a cache file afterwards (`engine.device_ceilings`).
`/roofline` serves API clients the same report as plain data.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass

import gradio as gr

from engine import EngineError, device_ceilings, engine_roofline, project_hardware
from playground.figures.configuration import config_summary
from playground.figures.projection_view import projection_html
from playground.figures.roofline_chart import roofline_summary_html, roofline_svg
from playground.roofline.probe import run_probe
from playground.shared.context import PlaygroundContext
from playground.shared.errors import Refused
from playground.shared.zero_gpu import NOT_PER_CALL

PROBE, LAST_MINUTE, EVERYTHING = "the probe's steps", "the last 60 s", "every recorded step"
WINDOWS = (PROBE, LAST_MINUTE, EVERYTHING)
OUTPUTS = ("rl_chart", "rl_summary", "rl_projection", "rl_report", "rl_probe_started", "rl_window")


@dataclass
class RooflineView:
    """What the tab shows (the roofline, then the what-if projection), the report as plain data (the API's answer,
    with the projection under "projection"), or why there is none."""

    chart: str
    summary: str
    projection: str
    report: dict | None
    reason: str | None = None

    @classmethod
    def unavailable(cls, reason: str) -> RooflineView:
        return cls(roofline_svg(None), roofline_summary_html(None, reason), projection_html(None), None, reason)


def roofline_view(engine, since: float, title: str = "", refresh: bool = False) -> RooflineView:
    """The chart, the words and the table of `engine`'s steps after `since`, and their projection onto other
    devices; the reason where it cannot tell."""
    try:
        report = engine_roofline(engine, since, refresh=refresh)
    except ValueError as error:
        return RooflineView.unavailable(str(error))
    heading = f'<div class="rl-config">{html.escape(title)}</div>' if title else ""
    has_steps = report.prefill is not None or report.decode is not None
    projection = project_hardware(report, engine.info) if has_steps else None
    answer = {**report.to_dict(), "projection": projection.to_dict() if projection else None}
    return RooflineView(heading + roofline_svg(report), roofline_summary_html(report),
                        projection_html(projection), answer)


class RooflineHandlers:
    """The tab's handlers over the context: show the recorded steps, run the probe, measure the ceilings again."""

    def __init__(self, context: PlaygroundContext):
        self.context = context

    @staticmethod
    def _since(window: str, probe_started: float) -> float:
        if window == LAST_MINUTE:
            return time.perf_counter() - 60.0
        if window == PROBE:
            return probe_started
        return 0.0

    def _view(self, session, window: str, probe_started: float, refresh: bool = False) -> RooflineView:
        with self.context.pool.lease_if_loaded(session.config) as entry:
            if entry is None:
                return RooflineView.unavailable("The engine of the active configuration is not loaded yet: press "
                                                "Apply, send a chat message, or Run probe.")
            engine = entry.engine
            if refresh:
                try:
                    with self.context.measurements.held(session):  # measuring: one measurement at a time
                        device_ceilings(engine.info.device, engine.info.dtype, refresh=True)
                except Refused as refusal:
                    return RooflineView.unavailable(f"The ceilings could not be measured: {refusal}")
            return roofline_view(engine, self._since(window, probe_started), config_summary(session.config,
                                                                                            engine.info))

    def _probe(self, session) -> tuple[RooflineView, float]:
        if self.context.settings.zero_gpu:
            return RooflineView.unavailable(f"The probe is off in ZeroGPU mode: {NOT_PER_CALL}"), 0.0
        try:
            with self.context.measurements.held(session), self.context.pool.lease(session.config) as entry:
                started = run_probe(entry.engine)
                title = config_summary(session.config, entry.engine.info)
                return roofline_view(entry.engine, started, title), started
        except (EngineError, Refused) as error:
            return RooflineView.unavailable(f"The probe could not run: "
                                            f"{self.context.describe(error)}"), 0.0

    @staticmethod
    def _outputs(view: RooflineView, probe_started: float, window: str) -> tuple:
        return view.chart, view.summary, view.projection, view.report, probe_started, window

    @staticmethod
    def _window(window, probe_started) -> tuple[str, float]:
        is_time = isinstance(probe_started, float | int) and not isinstance(probe_started, bool)
        started = float(probe_started) if is_time and 0 < probe_started <= time.perf_counter() else 0.0
        if window not in WINDOWS or (window == PROBE and not started):
            window = EVERYTHING
        return window, started

    def show(self, window, probe_started, session) -> tuple:
        """The steps of the window on the engine of this session's configuration, if it is loaded."""
        window, started = self._window(window, probe_started)
        return self._outputs(self._view(self.context.session_of(session), window, started), started, window)

    def remeasure(self, window, probe_started, session) -> tuple:
        """Measure the device's ceilings again (overwriting the cache), then show the window."""
        window, started = self._window(window, probe_started)
        return self._outputs(self._view(self.context.session_of(session), window, started, refresh=True), started,
                             window)

    def probe(self, session) -> tuple:
        """Load the active configuration if needed, run the probe on it, and show the probe's steps."""
        view, started = self._probe(self.context.session_of(session))
        return self._outputs(view, started, PROBE if started else EVERYTHING)

    def api_roofline(self, probe, session) -> dict:
        """`/roofline`: the report (after running the probe when `probe` is true) as plain data."""
        session = self.context.session_of(session)
        view = self._probe(session)[0] if probe is True else self._view(session, EVERYTHING, 0.0)
        if view.report is None:
            raise gr.Error(view.reason or "no roofline", print_exception=False)
        return view.report
