"""Line charts drawn as inline SVG, shared by the chat's live charts and the Compare and Benchmark run charts.

Why inline SVG and not gr.LinePlot: Gradio's plot keeps the colour scale of its first data and swaps only the data
afterwards (a run added to an overlay was not drawn, and a previous engine's series stayed), writes Vega-Lite v5
specs for the v6 library it bundles (one console warning per render), and raised "Cannot read properties of null
(reading 'offsetWidth')" when a plot was hidden while resizing. An SVG drawn here from plain numbers shows exactly
the series it is given, and a test can count its lines.

The text is sized in the SVG's own units: `width` is about the width the chart is shown at, so 11 units read as
about 11 pixels.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

HEIGHT = 170
LEFT, RIGHT, TOP, BOTTOM = 46, 10, 8, 34
FONT = 11


@dataclass(frozen=True)
class Axes:
    """The axes of one chart: the x range (fixed, or from 0 to a round top above the data when `x_high` is None),
    the axis titles, whether y counts whole things, and how wide the chart is drawn (SVG units)."""

    x_title: str
    y_title: str
    x_low: float = 0.0
    x_high: float | None = None
    integer_y: bool = False
    width: int = 340


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
    if abs(value) >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:.3g}"


def line_svg(axes: Axes, lines: dict[str, list[tuple[float, float]]], colours: dict[str, str], label: str) -> str:
    """An SVG of `lines` (series label -> [(x, y)]), each a polyline with its label in `data-series`, over grid
    lines, ticks and both axis titles; y starts at 0."""
    x_low = axes.x_low
    x_high = axes.x_high if axes.x_high is not None else nice_top(
        max((t for points in lines.values() for t, _ in points), default=0.0), False)
    y_top = nice_top(max((v for points in lines.values() for _, v in points), default=0.0), axes.integer_y)
    plot_w, plot_h = axes.width - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + plot_w * (t - x_low) / ((x_high - x_low) or 1.0)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / y_top)

    parts = []
    for index in range(5):
        level = y(y_top * index / 4)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{axes.width - RIGHT}" y1="{level:.1f}" y2="{level:.1f}"/>'
                     f'<text class="tick" x="{LEFT - 4}" y="{level + 4:.1f}" text-anchor="end">'
                     f'{_tick(y_top * index / 4)}</text>')
        t = x_low + (x_high - x_low) * index / 4
        parts.append(f'<text class="tick" x="{x(t):.1f}" y="{HEIGHT - BOTTOM + FONT + 3}" text-anchor="middle">'
                     f'{_tick(t)}</text>')
    parts.append(f'<text class="axis" x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 4}" text-anchor="middle">'
                 f'{html.escape(axes.x_title)}</text>')
    parts.append(f'<text class="axis" transform="rotate(-90)" x="{-(TOP + plot_h / 2):.1f}" y="{FONT}" '
                 f'text-anchor="middle">{html.escape(axes.y_title)}</text>')
    for name, points in lines.items():
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
        parts.append(f'<polyline class="run-line" data-series="{html.escape(name)}" points="{path}" '
                     f'stroke="{colours[name]}"/>')
    return (f'<svg class="line-svg" viewBox="0 0 {axes.width} {HEIGHT}" role="img" aria-label="{html.escape(label)}" '
            f'font-size="{FONT}">{"".join(parts)}</svg>')


def chart_box(title: str, body: str, legend: dict[str, str], subtitle: str | None = None) -> str:
    """A chart's box: its title (and a line under it, e.g. which engine it plots), its SVG (or a placeholder) and a
    legend of series label -> colour."""
    keys = "".join(f'<span class="key" style="background:{colour}"></span>{html.escape(name)}'
                   for name, colour in legend.items())
    under = f'<div class="hchart-subtitle">{html.escape(subtitle)}</div>' if subtitle else ""
    return (f'<div class="run-chart-box"><div class="hchart-title">{html.escape(title)}</div>{under}{body}'
            + (f'<div class="hchart-legend">{keys}</div>' if keys else "") + "</div>")
