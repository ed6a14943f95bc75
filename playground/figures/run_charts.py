"""Charts of measured runs (Compare and Benchmark): output throughput, running batch and KV blocks over
each run's own time, several runs overlaid on one set of axes.

Why apart from `live_charts`: the chat's charts follow an engine over a sliding window ending now; these
follow one run from its first request (time 0) to its last, so two configurations, or this run and
an earlier one, can be laid over each other. They are drawn from the engine's step records during
the run, which include any other session's requests the same engine served meanwhile (the note under
the charts says so). The drawing itself is `svg_lines`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine import StepRecord
from playground.figures.svg_lines import Axes, chart_box, line_svg

MAX_BINS = 48
MIN_BIN_S = 0.05
PALETTE = ("#4f46e5", "#f97316", "#64748b", "#0d9488", "#db2777", "#65a30d", "#0891b2", "#a16207")
CHARTS_NOTE = ("Each run from its first request (time 0) to its last, drawn from the engine's steps meanwhile (another "
               "session's requests on the same engine would show too): output tokens per second in each time bin, "
               "and the largest running batch and KV blocks in use while a step ran in it.")


@dataclass(frozen=True)
class RunChart:
    """One chart of runs: its name (element ids), title and axes."""

    name: str
    title: str
    axes: Axes


X_TITLE = "seconds since the first request"
RUN_THROUGHPUT = RunChart("run_throughput", "Output tokens / s", Axes(X_TITLE, "tokens / s", width=300))
RUN_BATCH = RunChart("run_batch", "Running batch", Axes(X_TITLE, "sequences", integer_y=True, width=300))
RUN_KV = RunChart("run_kv", "KV blocks in use", Axes(X_TITLE, "blocks", integer_y=True, width=300))
RUN_CHARTS = (RUN_THROUGHPUT, RUN_BATCH, RUN_KV)


@dataclass(frozen=True)
class Timeline:
    """One run on the charts: its label, when it started (time.perf_counter()), its engine's steps, and its
    colour (by default the palette's, in the order the runs are given)."""

    label: str
    started: float
    steps: list[StepRecord]
    colour: str | None = None


def bin_seconds(longest_s: float) -> float:
    """A round bin width that gives at most MAX_BINS bins over the longest run."""
    raw = max(longest_s / MAX_BINS, MIN_BIN_S)
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(step * magnitude for step in (1, 2, 5, 10) if step * magnitude >= raw)


def run_series(timelines: list[Timeline], until: float | None = None) -> dict[str, dict[str, list[tuple]]]:
    """Chart name -> {run label -> [(seconds since its start, value)]}, each run binned from its own start.

    Tokens count in the bin where their step ended; a step's batch and KV blocks count in every bin it
    overlapped (a long prefill step does not leave empty bins behind it). `until` (a time.perf_counter()
    value) extends a run still in progress to now.
    """
    spans = [max([s.time - t.started for s in t.steps] + [(until - t.started) if until else 0.0, 0.0])
             for t in timelines]
    width = bin_seconds(max(spans, default=0.0))
    series: dict[str, dict[str, list[tuple]]] = {chart.name: {} for chart in RUN_CHARTS}
    for timeline, span in zip(timelines, spans, strict=True):
        count = max(1, math.ceil(span / width))
        tokens, batch, blocks = [0.0] * count, [0] * count, [0] * count
        for step in timeline.steps:
            last = min(int(max(step.time - timeline.started, 0.0) / width), count - 1)
            first = min(int(max(step.time - step.duration - timeline.started, 0.0) / width), last)
            tokens[last] += step.num_output_tokens / width
            for index in range(first, last + 1):
                batch[index] = max(batch[index], step.batch_size)
                blocks[index] = max(blocks[index], step.kv_blocks_used)
        times = [round((index + 1) * width, 6) for index in range(count)]
        for chart, values in ((RUN_THROUGHPUT, tokens), (RUN_BATCH, batch), (RUN_KV, blocks)):
            series[chart.name][timeline.label] = list(zip(times, values, strict=True))
    return series


def run_charts_html(timelines: list[Timeline], until: float | None = None) -> tuple[str, ...]:
    """The three charts (HTML) of `timelines` overlaid, in RUN_CHARTS order, each with its legend; placeholders
    before any run. Each run's line starts at time 0 at its first bin's value."""
    if not timelines:
        return tuple(chart_box(chart.title, '<div class="hchart-empty">no run yet</div>', {}) for chart in RUN_CHARTS)
    colours = {t.label: t.colour or PALETTE[index % len(PALETTE)] for index, t in enumerate(timelines)}
    series = run_series(timelines, until)
    return tuple(chart_box(chart.title, line_svg(chart.axes, {label: [(0.0, points[0][1]), *points]
                                                              for label, points in series[chart.name].items()},
                                                 colours, chart.title), colours)
                 for chart in RUN_CHARTS)
