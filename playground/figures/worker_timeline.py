"""A timeline of what each worker process was computing: one lane per worker, one bar per piece of work.

Why: pipeline parallelism's cost is the time a stage waits for the stage before it (the bubble), and
disaggregation's point is that the decode worker keeps stepping while the prefill worker is busy; both
are seen at once in a chart of busy bars over a shared clock, where the gaps are the idle time. The
engine records the spans on one clock (CLOCK_MONOTONIC, system-wide, so worker processes agree); this
module only draws the latest window of them as inline SVG, like the other charts (svg_lines.py).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from playground.figures.svg_lines import FONT

LANE_HEIGHT = 18
LANE_GAP = 6
LABEL_WIDTH = 92
TOP, BOTTOM, RIGHT = 6, 28, 10
COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#eeca3b", "#9d755d")


@dataclass(frozen=True)
class Span:
    """`lane` was busy from `start` to `end` (seconds on the engine's clock) with work `group` (a micro-batch or a
    kind of work: bars of one group share a colour)."""

    lane: int
    start: float
    end: float
    group: int = 0
    label: str = ""


def busy_share(spans: list[Span], lane: int, window: tuple[float, float]) -> float:
    """The share of `window` that `lane` spent in its spans (overlaps within a lane counted once)."""
    low, high = window
    if high <= low:
        return 0.0
    busy, reached = 0.0, low
    for span in sorted((s for s in spans if s.lane == lane), key=lambda s: s.start):
        start, end = max(span.start, reached), min(span.end, high)
        if end > start:
            busy += end - start
            reached = end
    return busy / (high - low)


def timeline_svg(lanes: list[str], spans: list[Span], title: str, width: int = 520) -> str:
    """The chart: a lane per name in `lanes`, the spans as bars from the earliest start to the latest end, each
    lane's busy share at its end, and a time axis in milliseconds. An empty chart says so."""
    if not spans:
        return f'<div class="hchart-empty">{html.escape(title)}: no work recorded yet</div>'
    low = min(span.start for span in spans)
    high = max(span.end for span in spans)
    duration = max(high - low, 1e-9)
    plot = width - LABEL_WIDTH - RIGHT - 40
    height = TOP + len(lanes) * (LANE_HEIGHT + LANE_GAP) + BOTTOM

    def x(t: float) -> float:
        return LABEL_WIDTH + (t - low) / duration * plot

    parts = [f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" class="worker-timeline" '
             f'aria-label="{html.escape(title)}" style="font-size:{FONT}px">']
    for index, name in enumerate(lanes):
        y = TOP + index * (LANE_HEIGHT + LANE_GAP)
        share = busy_share(spans, index, (low, high))
        parts.append(f'<text x="{LABEL_WIDTH - 6}" y="{y + LANE_HEIGHT - 5}" text-anchor="end">'
                     f'{html.escape(name)}</text>')
        parts.append(f'<rect x="{LABEL_WIDTH}" y="{y}" width="{plot}" height="{LANE_HEIGHT}" fill="#eee"/>')
        parts.append(f'<text x="{LABEL_WIDTH + plot + 4}" y="{y + LANE_HEIGHT - 5}">{share:.0%}</text>')
    for span in spans:
        y = TOP + span.lane * (LANE_HEIGHT + LANE_GAP)
        left = x(span.start)
        bar = max(x(span.end) - left, 0.5)
        tip = html.escape(f"{lanes[span.lane]}: {span.label + ' · ' if span.label else ''}"
                          f"{(span.end - span.start) * 1000:.2f} ms")
        parts.append(f'<rect class="busy" x="{left:.1f}" y="{y}" width="{bar:.1f}" height="{LANE_HEIGHT}" '
                     f'fill="{COLOURS[span.group % len(COLOURS)]}"><title>{tip}</title></rect>')
    axis_y = TOP + len(lanes) * (LANE_HEIGHT + LANE_GAP) + 12
    parts.append(f'<text x="{LABEL_WIDTH}" y="{axis_y}">0</text>')
    parts.append(f'<text x="{LABEL_WIDTH + plot}" y="{axis_y}" text-anchor="end">{duration * 1000:.1f} ms</text>')
    parts.append(f'<text x="{LABEL_WIDTH + plot / 2}" y="{axis_y + 12}" text-anchor="middle">'
                 f'{html.escape(title)} · grey = idle · % = busy share of the window</text>')
    parts.append("</svg>")
    return "".join(parts)
