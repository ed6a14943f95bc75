"""The roofline chart and its table, drawn from an `engine.RooflineReport` as HTML.

Why SVG by hand: a roofline only reads on log-log axes (intensities and FLOP/s span decades), which
Gradio's plots do not offer, and the roof, the ridge and each phase's gap to the roof must be drawn
together. The functions are pure (report in, markup out), so tests read the drawn coordinates.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from engine import PhasePoint, RooflineReport

WIDTH, HEIGHT = 640, 380
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 16, 48
COLOURS = {"prefill": "#f97316", "decode": "#4f46e5", "roof": "#0f172a"}


@dataclass(frozen=True)
class LogAxes:
    """Decade-aligned log scales of both axes, mapped onto the plot area."""

    x_low: float
    x_high: float
    y_low: float
    y_high: float

    @classmethod
    def around(cls, xs: list[float], ys: list[float]) -> LogAxes:
        def decades(values: list[float]) -> tuple[float, float]:
            low, high = math.floor(math.log10(min(values) / 2)), math.ceil(math.log10(max(values) * 2))
            return 10.0**low, 10.0**max(high, low + 1)
        return cls(*decades(xs), *decades(ys))

    def x(self, value: float) -> float:
        share = (math.log10(value) - math.log10(self.x_low)) / (math.log10(self.x_high) - math.log10(self.x_low))
        return LEFT + share * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        share = (math.log10(value) - math.log10(self.y_low)) / (math.log10(self.y_high) - math.log10(self.y_low))
        return HEIGHT - BOTTOM - share * (HEIGHT - TOP - BOTTOM)


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _ticks(axes: LogAxes) -> list[str]:
    parts = []
    for exponent in range(round(math.log10(axes.x_low)), round(math.log10(axes.x_high)) + 1):
        x = axes.x(10.0**exponent)
        parts.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM}" class="rl-grid"/>'
                     f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{10.0**exponent:g}</text>')
    for exponent in range(round(math.log10(axes.y_low)), round(math.log10(axes.y_high)) + 1):
        y = axes.y(10.0**exponent)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" class="rl-grid"/>'
                     f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_si(10.0**exponent, "")}</text>')
    parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 10}" text-anchor="middle">'
                 'arithmetic intensity (FLOPs per byte moved, log)</text>'
                 f'<text transform="translate(16 {(TOP + HEIGHT - BOTTOM) / 2}) rotate(-90)" text-anchor="middle">'
                 'FLOP/s (log)</text>')
    return parts


def _points(report: RooflineReport) -> list[PhasePoint]:
    """The points to draw: prefill, and decode per batch size when there are several sizes (else decode as a
    whole; the sentences and the table give the whole either way)."""
    decode = report.decode_by_batch if len(report.decode_by_batch) > 1 else [report.decode]
    return [point for point in (report.prefill, *decode)
            if point is not None and point.intensity > 0 and point.achieved_flops > 0]


def _label_position(point: PhasePoint, index: int, x: float, y: float, radius: int) -> str:
    """Prefill's label to its right; decode points' alternately below and above, so neighbours stay readable."""
    if point.phase == "prefill":
        return f'x="{x + radius + 3:.1f}" y="{y + 4:.1f}"'
    offset = radius + 13 if index % 2 == 0 else -(radius + 5)
    return f'x="{x:.1f}" y="{y + offset:.1f}" text-anchor="middle"'


def roofline_svg(report: RooflineReport | None) -> str:
    """The chart: the roof (bandwidth slope, then the matmul peak), the ridge, and each phase at its
    intensity and achieved FLOP/s, with a dotted line up to the roof it could reach there."""
    if report is None:
        return '<div class="hchart-empty" id="roofline-chart">no roofline yet</div>'
    ceilings, points = report.ceilings, _points(report)
    ridge = ceilings.ridge_intensity
    axes = LogAxes.around([ridge, *(p.intensity for p in points)], [ceilings.peak_flops,
                                                                      *(p.achieved_flops for p in points)])
    start = max(axes.x_low, axes.y_low / ceilings.bandwidth)
    roof = [(start, start * ceilings.bandwidth), (ridge, ceilings.peak_flops), (axes.x_high, ceilings.peak_flops)]
    path = " ".join(f"{axes.x(x):.1f},{axes.y(y):.1f}" for x, y in roof)
    parts = [f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" class="roofline-svg" role="img" '
             'aria-label="roofline chart" xmlns="http://www.w3.org/2000/svg">', *_ticks(axes),
             f'<polyline points="{path}" class="rl-roof" fill="none" stroke="{COLOURS["roof"]}" stroke-width="2.5"/>',
             f'<line x1="{axes.x(ridge):.1f}" y1="{TOP}" x2="{axes.x(ridge):.1f}" y2="{HEIGHT - BOTTOM}" '
             'class="rl-ridge" stroke-dasharray="4 4"/>',
             f'<text x="{axes.x(ridge) + 4:.1f}" y="{HEIGHT - BOTTOM - 6}" class="rl-note">'
             f'ridge {ridge:.3g} FLOP/B</text>',
             f'<text x="{axes.x(ridge) + 6:.1f}" y="{axes.y(ceilings.peak_flops) - 6:.1f}" '
             f'class="rl-note">matmul peak {_si(ceilings.peak_flops, "FLOP/s")}</text>',
             f'<text x="{LEFT + 8}" y="{TOP + 14}" class="rl-note">slope: memory read '
             f'{_si(ceilings.bandwidth, "B/s")} × intensity</text>']
    decode_index = 0
    for point in points:
        x, y = axes.x(point.intensity), axes.y(point.achieved_flops)
        roof_y = axes.y(point.attainable_flops)
        kind = "prefill" if point.phase == "prefill" else "decode"
        radius = 7 if kind == "prefill" else 5
        label = point.phase.replace("decode, batch ", "decode b=")
        position = _label_position(point, decode_index, x, y, radius)
        decode_index += kind == "decode"
        parts.append(
            f'<g class="rl-point" data-phase="{html.escape(point.phase)}" data-intensity="{point.intensity:.6g}" '
            f'data-flops="{point.achieved_flops:.6g}" data-fraction="{point.fraction_of_ceiling:.4f}">'
            f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{roof_y:.1f}" stroke="{COLOURS[kind]}" '
            'stroke-dasharray="2 3"/>'
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{radius}" fill="{COLOURS[kind]}"><title>'
            f'{html.escape(point.phase)}: {point.intensity:.3g} FLOP/B, {_si(point.achieved_flops, "FLOP/s")}, '
            f'{point.fraction_of_ceiling:.0%} of the roof</title></circle>'
            f'<text {position} class="rl-label">{html.escape(label)} '
            f'{point.fraction_of_ceiling:.0%}</text></g>')
    parts.append("</svg>")
    return f'<div class="roofline-chart" id="roofline-chart">{"".join(parts)}</div>'


def _row(point: PhasePoint) -> str:
    per_step = point.steps or 1
    cells = [point.phase, f"{point.steps}", f"{point.mean_batch_size:.1f}", f"{1e3 * point.seconds / per_step:.2f}",
             _si(point.flops / per_step, "FLOP"), _si(point.weight_bytes / per_step, "B"),
             _si(point.kv_bytes / per_step, "B"), f"{point.intensity:.3g}", _si(point.achieved_flops, "FLOP/s"),
             _si(point.achieved_bandwidth, "B/s"), point.verdict, f"{point.fraction_of_ceiling:.0%}"]
    return "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells) + "</tr>"


def roofline_summary_html(report: RooflineReport | None, reason: str | None = None) -> str:
    """The verdict in words, then the ceilings and a table of each phase's work, time and place."""
    if report is None:
        return f'<div class="rl-summary" id="roofline-summary"><p>{html.escape(reason or "")}</p></div>'
    c = report.ceilings
    origin = "read from the cache" if c.source == "cache" else "measured just now"
    ceilings = (f"<p class='rl-ceilings'>Ceilings of <b>{html.escape(c.device)}</b> in {html.escape(c.dtype)} "
                f"({c.threads} thread(s)): matmul peak <b>{_si(c.peak_flops, 'FLOP/s')}</b> "
                f"({c.matmul_size}×{c.matmul_size} product), memory read <b>{_si(c.bandwidth, 'B/s')}</b> "
                f"({_si(c.bandwidth_bytes, 'B')} buffer); ridge {c.ridge_intensity:.3g} FLOP/byte; {origin}: "
                f"the best of {c.runs} measurement(s), the last at {html.escape(c.measured_at)}. On a shared "
                "machine a measurement can only fall short of the ceiling, so measuring again keeps the best.</p>")
    verdict = "".join(f"<li>{html.escape(line)}</li>" for line in report.summary())
    head = ("<tr><th>steps of</th><th>steps</th><th>mean batch</th><th>ms / step</th><th>FLOPs / step</th>"
            "<th>weights read / step</th><th>K/V moved / step</th><th>FLOP / byte</th><th>achieved</th>"
            "<th>bytes / s</th><th>bound</th><th>of ceiling</th></tr>")
    points = [p for p in (report.prefill, report.decode) if p] + (
        report.decode_by_batch if len(report.decode_by_batch) > 1 else [])
    table = f"<table class='rl-table'>{head}{''.join(_row(p) for p in points)}</table>" if points else ""
    return f'<div class="rl-summary" id="roofline-summary"><ul>{verdict}</ul>{ceilings}{table}</div>'
