"""Charts of measured runs (Compare and Benchmark): output throughput, running batch and KV blocks over
each run's own time, several runs overlaid on one set of axes.

Why apart from `live_charts`: the chat's charts follow an engine over a sliding window ending now; these
follow one run from its first request (time 0) to its last, so two configurations, or this run and
an earlier one, can be laid over each other. They are drawn from the engine's step records during
the run, which include any other session's requests the same engine served meanwhile (the note under
the charts says so).

Why inline SVG and not gr.LinePlot: a Gradio plot keeps the colour scale of its first data and swaps
only the data afterwards, so a run added to an overlay was not drawn; an SVG drawn here from plain
numbers shows exactly the runs it is given, and a test can count its lines.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from engine import StepRecord

MAX_BINS = 48
MIN_BIN_S = 0.05
PALETTE = ("#4f46e5", "#f97316", "#64748b", "#0d9488", "#db2777", "#65a30d", "#0891b2", "#a16207")
WIDTH, HEIGHT = 360, 170
LEFT, RIGHT, TOP, BOTTOM = 44, 10, 8, 30
CHARTS_NOTE = ("Each run from its first request (time 0) to its last, drawn from the engine's steps meanwhile (another "
               "session's requests on the same engine would show too): output tokens per second in each time bin, "
               "and the largest running batch and KV blocks in use while a step ran in it.")


@dataclass(frozen=True)
class RunChart:
    """One chart of runs: its name (element ids), title and y-axis title."""

    name: str
    title: str
    y_title: str
    integer_y: bool = False


RUN_THROUGHPUT = RunChart("run_throughput", "Output tokens / s", "tokens / s")
RUN_BATCH = RunChart("run_batch", "Running batch", "sequences", integer_y=True)
RUN_KV = RunChart("run_kv", "KV blocks in use", "blocks", integer_y=True)
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


def nice_top(value: float, integer: bool) -> float:
    """An axis top at or above `value` that splits into 4 round ticks (at least 4 for counts, 1 otherwise)."""
    if value <= 0:
        return 4 if integer else 1.0
    raw = value / 4
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(s * magnitude for s in (1, 2, 2.5, 5, 10) if s * magnitude >= raw)
    if integer:
        step = max(1, math.ceil(step))
    return step * 4


def _tick(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _svg(chart: RunChart, lines: dict[str, list[tuple]], colours: dict[str, str]) -> str:
    x_top = nice_top(max((t for points in lines.values() for t, _ in points), default=0.0), False)
    y_top = nice_top(max((v for points in lines.values() for _, v in points), default=0.0), chart.integer_y)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + plot_w * t / x_top

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / y_top)

    parts = []
    for index in range(5):
        value = y_top * index / 4
        level = y(value)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{level:.1f}" y2="{level:.1f}"/>'
                     f'<text class="tick" x="{LEFT - 4}" y="{level + 3:.1f}" text-anchor="end">{_tick(value)}</text>')
    for index in range(5):
        t = x_top * index / 4
        parts.append(f'<text class="tick" x="{x(t):.1f}" y="{HEIGHT - BOTTOM + 12}" text-anchor="middle">'
                     f'{t:.2g}</text>')
    parts.append(f'<text class="axis" x="{LEFT + plot_w / 2}" y="{HEIGHT - 4}" text-anchor="middle">seconds since '
                 'the first request</text>')
    parts.append(f'<text class="axis" transform="rotate(-90)" x="{-(TOP + plot_h / 2):.1f}" y="11" '
                 f'text-anchor="middle">{html.escape(chart.y_title)}</text>')
    for label, points in lines.items():
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in [(0.0, points[0][1]), *points])
        parts.append(f'<polyline class="run-line" data-series="{html.escape(label)}" points="{path}" '
                     f'stroke="{colours[label]}"/>')
    return (f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html.escape(chart.title)}">'
            f'{"".join(parts)}</svg>')


def run_charts_html(timelines: list[Timeline], until: float | None = None) -> tuple[str, ...]:
    """The three charts (HTML) of `timelines` overlaid, in RUN_CHARTS order, each with its legend; placeholders
    before any run."""
    if not timelines:
        return tuple(f'<div class="run-chart-box"><div class="hchart-title">{html.escape(chart.title)}</div>'
                     '<div class="hchart-empty">no run yet</div></div>' for chart in RUN_CHARTS)
    colours = {t.label: t.colour or PALETTE[index % len(PALETTE)] for index, t in enumerate(timelines)}
    series = run_series(timelines, until)
    legend = "".join(f'<span class="key" style="background:{colour}"></span>{html.escape(label)}'
                     for label, colour in colours.items())
    return tuple(f'<div class="run-chart-box"><div class="hchart-title">{html.escape(chart.title)}</div>'
                 f'{_svg(chart, series[chart.name], colours)}<div class="hchart-legend">{legend}</div></div>'
                 for chart in RUN_CHARTS)
