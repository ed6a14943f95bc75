"""What-if hardware as HTML: the measured configuration's steps projected onto other devices, as a table, a
chart of the decode step's terms per device, and the projections beside the committed GPU measurements.

Why apart from the roofline chart: the roofline places what was measured here; this shows estimates for
devices that were not used, so every figure says it is one ("≈", "est."), and the GPU rows say what their
overhead term rests on. Pure functions of an `engine.HardwareProjection`.
"""

from __future__ import annotations

import html

from engine import HardwareProjection
from playground.glossary.terms import tooltip

WIDTH, LABEL, RIGHT, BAR, GAP, TOP = 640, 200, 70, 16, 8, 28
COLOURS = {"memory": "#4f46e5", "compute": "#f97316", "overhead": "#94a3b8"}
MEASURED_LABEL = "this machine (measured)"


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3g}"


def _header(text: str, term: str) -> str:
    return f'<th title="{html.escape(tooltip(term))}">{html.escape(text)}</th>'


def _step_name(step: dict) -> str:
    if step["phase"] == "prefill":
        return f"TTFT: one prefill step ({step['tokens']:.0f} tokens, {step['batch']:.3g} prompts)"
    return f"TPOT at batch {step['batch']:.3g}"


def _device_cell(device: dict, rows: int) -> str:
    name = html.escape(device["device"])
    checks = device["checks"]
    if checks:
        errors = [check["error"] for check in checks]
        name += (f'<div class="pj-checked">checked on its committed run: {min(errors):+.1%} to {max(errors):+.1%} '
                 "(decode TPOT, projected vs measured)</div>")
    return (f'<td rowspan="{rows}" class="pj-device" title="{html.escape(device["source"])}">{name}'
            f'<div class="pj-source">{html.escape(device["overhead"])}</div></td>')


def _row(step: dict) -> str:
    numbers = [f"≈ {_ms(step['seconds'])} ms", f"≈ {step['tokens_per_second']:,.0f}", _ms(step["compute_seconds"]),
               _ms(step["memory_seconds"]), _ms(step["overhead_seconds"])]
    return (f'<td class="pj-step">{html.escape(_step_name(step))}</td>'
            + "".join(f'<td class="pj-num">{html.escape(cell)}</td>' for cell in numbers)
            + f'<td class="pj-bound pj-{step["bound"]}">{html.escape(step["bound"])}</td>'
            f'<td class="pj-toggle">{html.escape(step["toggle"])}</td>')


def projection_table_html(projection: HardwareProjection | None, reason: str | None = None) -> str:
    """Each device's estimated TTFT and TPOT at the measured batch sizes, their three terms, what bounds each and
    the toggle that would move it most; then the projections beside the committed GPU measurements."""
    if projection is None:
        return f'<div class="pj-view" id="projection-table"><p>{html.escape(reason or "")}</p></div>'
    data = projection.to_dict()
    head = ("<tr><th>device</th><th>step</th>" + _header("estimate", "projected_step")
            + "<th>tokens/s (est.; prefill: prompt tokens)</th>"
            + _header("compute ms", "projected_step") + _header("memory ms", "projected_step")
            + _header("overhead ms", "step_overhead") + _header("bound", "projected_bound")
            + _header("toggle that would move it most", "projected_toggle") + "</tr>")
    body = []
    for device in data["devices"]:
        steps = [step for step in (device["prefill"], *device["decode"]) if step]
        for index, step in enumerate(steps):
            first = _device_cell(device, len(steps)) if index == 0 else ""
            body.append(f'<tr class="pj-row" data-device="{html.escape(device["device"])}" '
                        f'data-phase="{html.escape(step["phase"])}" data-bound="{step["bound"]}">{first}{_row(step)}'
                        "</tr>")
    notes = "".join(f"<li>{html.escape(note)}</li>" for note in data["notes"])
    return (f'<div class="pj-view" id="projection-table"><h4>What-if hardware (estimates, not measurements)</h4>'
            f'<ul class="pj-notes">{notes}</ul><div class="pj-scroll"><table class="rl-table pj-table">{head}'
            f'{"".join(body)}</table></div>{checks_html(projection)}</div>')


def checks_html(projection: HardwareProjection) -> str:
    """The committed GPU runs' decode TPOT, measured and projected, with the error."""
    rows = [check for device in projection.to_dict()["devices"] for check in device["checks"]]
    if not rows:
        return ""
    body = "".join(f'<tr class="pj-check"><td>{html.escape(c["device"])}</td><td>{html.escape(c["run"])}</td>'
                   f'<td>{c["batch"]}</td><td>{_ms(c["measured_seconds"])}</td><td>≈ {_ms(c["projected_seconds"])}'
                   f'</td><td>{c["error"]:+.1%}</td></tr>' for c in rows)
    return ("<p class='pj-checks-title'>Projected beside measured: the committed <code>make gpu-check</code> runs' "
            "decode TPOT (the GPU overhead is fitted to these points)</p><div class='pj-scroll'><table "
            "class='rl-table pj-checks'><tr>"
            "<th>device</th><th>run: model</th><th>batch</th><th>measured ms</th><th>projected ms</th>"
            f"{_header('error', 'projection_error')}</tr>{body}</table></div>")


def projection_chart_svg(projection: HardwareProjection | None) -> str:
    """Per device, the decode step at the largest projected batch as a bar of its terms: the roof that binds
    (memory or compute), then the overhead; the estimated TPOT at its end."""
    devices = [device for device in projection.to_dict()["devices"] if device["decode"]] if projection else []
    if not devices:
        return '<div class="hchart-empty" id="projection-chart">no decode steps to project yet</div>'
    steps = [(MEASURED_LABEL if device["measured_here"] else device["device"], device["decode"][-1])
             for device in devices]
    longest = max(step["seconds"] for _, step in steps) or 1.0
    scale = (WIDTH - LABEL - RIGHT) / longest
    height = TOP + len(steps) * (BAR + GAP) + 24
    parts = [f'<svg viewBox="0 0 {WIDTH} {height}" class="projection-svg" role="img" xmlns="http://www.w3.org/2000/svg"'
             ' aria-label="estimated decode step per device">',
             f'<text x="8" y="16" class="pj-title">decode TPOT at batch {steps[0][1]["batch"]:.3g}, estimated (ms): '
             "the binding roof, then the per-step overhead</text>"]
    for index, (name, step) in enumerate(steps):
        y = TOP + index * (BAR + GAP)
        roof = "memory" if step["memory_seconds"] >= step["compute_seconds"] else "compute"
        roof_width = max(step["memory_seconds"], step["compute_seconds"]) * scale
        overhead_width = step["overhead_seconds"] * scale
        parts.append(
            f'<g class="pj-bar" data-device="{html.escape(name)}" data-seconds="{step["seconds"]:.6g}" '
            f'data-bound="{step["bound"]}"><text x="{LABEL - 6}" y="{y + BAR - 4}" text-anchor="end">'
            f'{html.escape(name)}</text>'
            f'<rect x="{LABEL}" y="{y}" width="{roof_width:.1f}" height="{BAR}" fill="{COLOURS[roof]}">'
            f'<title>{roof}: {_ms(max(step["memory_seconds"], step["compute_seconds"]))} ms</title></rect>'
            f'<rect x="{LABEL + roof_width:.1f}" y="{y}" width="{overhead_width:.1f}" height="{BAR}" '
            f'fill="{COLOURS["overhead"]}"><title>overhead: {_ms(step["overhead_seconds"])} ms</title></rect>'
            f'<text x="{LABEL + roof_width + overhead_width + 4:.1f}" y="{y + BAR - 4}">≈ {_ms(step["seconds"])}'
            "</text></g>")
    legend_y = height - 8
    parts += [f'<rect x="{LABEL + 150 * i}" y="{legend_y - 9}" width="10" height="10" fill="{COLOURS[key]}"/>'
              f'<text x="{LABEL + 150 * i + 14}" y="{legend_y}">{key}</text>' for i, key in enumerate(COLOURS)]
    parts.append("</svg>")
    return f'<div class="projection-chart" id="projection-chart">{"".join(parts)}</div>'


def projection_html(projection: HardwareProjection | None) -> str:
    """The Roofline tab's what-if section: the chart, then the table; or what it waits for."""
    if projection is None:
        return projection_table_html(None, "What-if hardware: the measured steps projected onto GPUs appear here "
                                           "once there are prefill or decode steps to place.")
    return projection_chart_svg(projection) + projection_table_html(projection)
