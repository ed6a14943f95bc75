"""HTML of the Compare and Benchmark tabs: a run's progress, the comparison table with its ratios, both
outputs with their token differences marked, and the benchmark's tables.

Why apart from the handlers: rendering is a pure function of plain data (the figures dicts the APIs
return), so it can be checked without an engine, and the handlers stay about running things. Every
figure's label carries its glossary entry as a tooltip.
"""

from __future__ import annotations

import html
import time

from playground.figures.units import format_bytes
from playground.glossary.terms import tooltip
from playground.shared.measurement import MeasurementJob

NEUTRAL_BAND = 0.03  # ratios within 3% of 1 are not coloured as better or worse
# glossary term of each figure key (the key itself when it is one)
TERMS = {"mean_ttft_ms": "ttft", "mean_tpot_ms": "tpot", "mean_e2el_ms": "e2el", "p99_ttft_ms": "ttft",
         "p99_itl_ms": "itl"}


def format_figure(key: str, value) -> str:
    """A figure in its unit, read from its bench key."""
    if value is None:
        return "n/a"
    if key.endswith("_bytes"):
        return format_bytes(value)
    if key == "guided_mask_ms":
        return f"{value:.3f} ms"
    if key.endswith("_ms"):
        return f"{value:,.1f} ms"
    if key.endswith("_rate") or key.endswith("_share"):
        return f"{value:.1%}"
    if key == "perplexity":
        return f"{value:.2f}"
    if key == "duration":
        return f"{value:.2f} s"
    if key.startswith("request_"):
        return f"{value:,.2f} req/s"
    if key.endswith("_throughput"):
        return f"{value:,.1f} tok/s"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.3g}"


def applies(key: str, config: dict) -> bool:
    """Whether a figure means anything for a configuration (its resolved fields): a speculative acceptance needs
    speculation, a prefix-cache hit rate needs prefix caching in the native engine (transformers' block sharing
    is not counted). Where it does not apply the tables show "–", not a 0.0% or a 0.00x that reads as a result."""
    if key == "spec_acceptance_rate":
        return config.get("speculative", "off") != "off"
    if key == "prefix_cache_hit_rate":
        return bool(config.get("prefix_caching")) and config.get("backend") != "hf"
    return True


NOT_APPLICABLE = '<span class="na" title="does not apply to this configuration">–</span>'


def _label(key: str, text: str) -> str:
    return f'<span class="term" title="{html.escape(tooltip(TERMS.get(key, key)))}">{html.escape(text)}</span>'


def ratio_html(ratio: float | None, better: str | None, noise: str | None = None) -> str:
    """B/A as "1.23x", green when it is better for this figure, red when worse; with `noise` (why the difference
    cannot be told from noise) neither, and the reason says so."""
    if ratio is None:
        return '<span class="ratio">–</span>'
    if noise and better and abs(ratio - 1) > NEUTRAL_BAND:
        return f'<span class="ratio noise" title="{html.escape(noise)}">{ratio:.2f}× within noise</span>'
    kind = ""
    if better and abs(ratio - 1) > NEUTRAL_BAND:
        kind = " better" if (ratio < 1) == (better == "lower") else " worse"
    return f'<span class="ratio{kind}">{ratio:.2f}×</span>'


def is_timing(key: str) -> bool:
    """Figures that move with the machine's load from one run to the next (times and rates of tokens or requests);
    the others (bytes, perplexity, hit and acceptance rates) repeat exactly."""
    return key.endswith("_ms") or key.endswith("_throughput") or key.startswith("request_") or key.endswith("_share")


def noise_reason(key: str, base: list | None, other: list | None, rounds: int) -> str | None:
    """Why a timing figure's B/A cannot be called better or worse, or None when it can: with one round there is no
    spread to judge by; with more, the two sides' ranges (min - max over the rounds) overlap."""
    if not is_timing(key):
        return None
    if rounds < 2 or not base or not other:
        return "one round: no spread to tell this from noise (repeat the comparison)"
    if base[0] <= other[1] and other[0] <= base[1]:
        return "the two sides' ranges over the rounds overlap"
    return None


def progress_html(job: MeasurementJob, what: str, steps_done: int = 0, steps_total: int = 0) -> str:
    """A job's phase and a bar: requests done of the current run, and (for a comparison) runs done of all."""
    now = time.perf_counter()
    if job.phase == "running" and job.requests_total:
        detail = f"{job.label}: {job.requests_done} of {job.requests_total} requests done"
        fraction = job.requests_done / job.requests_total
    elif job.phase == "queued":
        detail = (f"waiting for this server's measurement slot: {job.ahead} measurement(s) ahead of it (one runs at a "
                  "time)" if job.ahead else "starting")
        fraction = 0.0
    else:
        phase = {"loading": "loading its engine", "sizing": "sizing its engine", "waiting": "waiting for its engine"}
        detail = f"{job.label}: {phase.get(job.phase, job.phase)}" if job.label else "starting"
        fraction = 0.0
    if steps_total:
        fraction = (steps_done + fraction) / steps_total
        detail += f" · run {min(steps_done + 1, steps_total)} of {steps_total}"
    state = "cancelling…" if job.cancel.is_set() else f"{what} {'queued' if job.phase == 'queued' else 'running'}"
    return (f'<div class="run-progress"><div class="run-progress-title">{html.escape(state)} · '
            f'{now - job.started:.1f} s</div><div class="progress-track"><span class="progress-fill" '
            f'style="width:{fraction * 100:.0f}%"></span></div><div class="progress-detail">{html.escape(detail)}'
            '</div></div>')


def notice_html(kind: str, text: str) -> str:
    return f'<div class="run-notice {kind}">{html.escape(text)}</div>' if text else ""


# ----- Compare -------------------------------------------------------------------------------------


def _side_applies(key: str, side: dict) -> bool:
    """`applies` for a side of a comparison; its guided-mask figures also need the side to send structured output."""
    return applies(key, side["config"]) and (not key.startswith("guided_") or side.get("guided") is not None)


def compare_table_html(outcome: dict, figures: tuple) -> str:
    """Rows: figures; columns: each side's median (spread over the repeats when repeated) and its ratio to A."""
    labels = outcome["labels"]
    sides, ratios = outcome["sides"], outcome["ratios"]
    head = "".join(f'<th>{html.escape(label)}</th>' + (f'<th>{html.escape(label)} / A</th>' if label != "A" else "")
                   for label in labels)
    rows = []
    for key, text, better in figures:
        cells = []
        base_applies = _side_applies(key, sides["A"])
        for label in labels:
            value, spread = sides[label]["figures"][key], sides[label]["spread"][key]
            shown = format_figure(key, value)
            if spread and outcome["rounds"] > 1 and spread[0] != spread[1]:
                shown += (f'<div class="spread">{format_figure(key, spread[0])} – '
                          f'{format_figure(key, spread[1])}</div>')
            reference = sides[label].get("perplexity_reference")
            if key == "perplexity" and value is not None and reference:
                shown += f'<div class="spread">float32 reference {reference:.2f} ({value / reference:.2f}x)</div>'
            side_applies = _side_applies(key, sides[label])
            cells.append(f'<td data-side="{html.escape(label)}" data-key="{key}">'
                         f'{shown if side_applies else NOT_APPLICABLE}</td>')
            if label != "A":
                ratio = ratios[label][key] if base_applies and side_applies else None
                noise = noise_reason(key, sides["A"]["spread"][key], spread, outcome["rounds"])
                cells.append(f'<td class="ratio-cell">{ratio_html(ratio, better, noise)}</td>')
        rows.append(f'<tr><th>{_label(key, text)}</th>{"".join(cells)}</tr>')
    configs = "".join(f'<div class="cmp-config"><b>{html.escape(label)}</b> {html.escape(sides[label]["summary"])}'
                      '</div>' for label in labels)
    orders = " · ".join("→".join(order) for order in outcome["orders"])
    note = (f'{outcome["rounds"]} round(s), each side timed alone, order {orders}; median over the rounds '
            f'(min – max below it). {len(outcome["prompts"])} prompt(s), max_tokens '
            f'{outcome["sampling"]["max_tokens"]}, temperature {outcome["sampling"]["temperature"]}, seed '
            f'{outcome["sampling"]["seed"]}. Peak memory is the whole process\'s (every engine in the pool). With '
            'prefix caching on, rounds after the first find the prompts cached (the hit rate\'s spread shows it). A '
            'timing ratio is coloured only when the two sides\' ranges over the rounds do not overlap; otherwise it '
            'reads "within noise". "–": the figure does not apply to that configuration.')
    return (f'<div id="cmp-table-wrap">{configs}<table class="cmp-table"><thead><tr><th>figure</th>{head}</tr>'
            f'</thead><tbody>{"".join(rows)}</tbody></table><div class="run-note">{html.escape(note)}</div></div>')


def _marked(pieces: list[str], first_difference: int | None) -> str:
    """The output token by token, every token from the first difference on marked."""
    if first_difference is None:
        return html.escape("".join(pieces))
    same = html.escape("".join(pieces[:first_difference]))
    differing = "".join(f'<span class="tok-diff">{html.escape(piece)}</span>' for piece in pieces[first_difference:])
    return same + differing


def compare_outputs_html(outcome: dict) -> str:
    """Per prompt: each side's output in a column; tokens after the first difference from A are marked on both."""
    labels = outcome["labels"]
    blocks = []
    for index, prompt in enumerate(outcome["prompts"]):
        differences = outcome["differences"][index]
        firsts = [d["first_difference"] for d in differences.values() if d["first_difference"] is not None]
        columns = []
        for label in labels:
            side = outcome["sides"][label]
            first = differences[label]["first_difference"] if label != "A" else (min(firsts) if firsts else None)
            if label == "A":
                verdict = "reference"
            elif differences[label]["identical"]:
                verdict = f"identical to A ({side['output_tokens'][index]} tokens)"
            else:
                verdict = f"differs from A from token {differences[label]['first_difference'] + 1}"
            columns.append(f'<div class="cmp-output" data-side="{html.escape(label)}"><div class="cmp-output-head">'
                           f'<b>{html.escape(label)}</b> · {html.escape(verdict)} · '
                           f'{html.escape(side["finish_reasons"][index])}</div>'
                           f'<div class="cmp-text">{_marked(side["pieces"][index], first)}</div></div>')
        blocks.append(f'<div class="cmp-prompt"><div class="cmp-prompt-text">{html.escape(prompt)}</div>'
                      f'<div class="cmp-columns cols-{len(labels)}">{"".join(columns)}</div></div>')
    legend = '<div class="run-note"><span class="tok-diff">marked</span> tokens: from the first token that differs ' \
             'from A (greedy outputs of an exact optimization are identical)</div>'
    return f'<div id="cmp-outputs-wrap">{legend}{"".join(blocks)}</div>'


# ----- Benchmark -----------------------------------------------------------------------------------

LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"))
STATS = ("mean", "median", "p90", "p99")
TOTALS = ("completed", "cancelled_requests", "duration", "request_throughput", "request_goodput",
          "output_throughput", "total_token_throughput", "prefix_cache_hit_rate", "spec_acceptance_rate",
          "peak_running")
TOTAL_LABELS = {"completed": "completed", "cancelled_requests": "cancelled", "duration": "duration",
                "request_throughput": "request throughput", "request_goodput": "goodput",
                "output_throughput": "output throughput", "total_token_throughput": "total token throughput",
                "prefix_cache_hit_rate": "prefix-cache hit rate", "spec_acceptance_rate": "speculative acceptance",
                "peak_running": "peak running"}


SURGE_ROWS = (("chat_p99_itl_outside_surge_ms", "chat users' p99 ITL outside the surge"),
              ("chat_p99_itl_during_surge_ms", "chat users' p99 ITL during the surge"),
              ("chat_median_itl_during_surge_ms", "chat users' median ITL during the surge"),
              ("chat_p99_ttft_ms", "chat users' p99 TTFT"),
              ("surge_median_ttft_ms", "surge prompts' median TTFT"), ("surge_p99_ttft_ms", "surge prompts' p99 TTFT"),
              ("surge_completed", "surge prompts completed"))


def surge_table_html(report: dict) -> str:
    """For a run with a surge: the chat users' token gaps during the surge beside those outside it (and their
    ratio: the stall a burst of long prompts causes), and each class's time to first token; '' without a surge."""
    if report.get("chat_itl_during_surge_count") is None:
        return ""
    rows = [f'<tr><th>{html.escape(label)}</th><td data-key="{key}">{html.escape(format_figure(key, report[key]))}'
            '</td></tr>' for key, label in SURGE_ROWS]
    during, outside = report["chat_p99_itl_during_surge_ms"], report["chat_p99_itl_outside_surge_ms"]
    ratio = f"{during / outside:.2f}x" if during and outside else "n/a"
    rows.insert(2, f'<tr><th>{_label("bench_surge", "during / outside (p99)")}</th>'
                   f'<td data-key="chat_p99_itl_surge_over_outside">{ratio}</td></tr>')
    return f'<table class="bench-table totals surge"><tbody>{"".join(rows)}</tbody></table>'


def benchmark_table_html(report: dict) -> str:
    """mean / median / p90 / p99 of TTFT, TPOT, ITL and E2EL, then the run's totals and rates, then (with a surge)
    the two request classes apart."""
    head = "".join(f"<th>{_label('mean', stat)}</th>" for stat in STATS)
    latency_rows = "".join(
        f"<tr><th>{_label(name, label)}</th>"
        + "".join(f'<td data-key="{stat}_{name}_ms">{format_figure("x_ms", report[f"{stat}_{name}_ms"])}</td>'
                  for stat in STATS) + "</tr>" for name, label in LATENCIES)
    slos = report["workload"]["goodput_slos"]
    totals = []
    for key in TOTALS:
        value = report[key]
        if not applies(key, report["config"]):
            totals.append(f'<tr><th>{_label(key, TOTAL_LABELS[key])}</th><td data-key="{key}">{NOT_APPLICABLE}</td>'
                          '</tr>')
            continue
        shown = format_figure(key, value)
        if key == "request_goodput":
            shown = ("set a TTFT or TPOT objective" if value is None else
                     shown + " · " + ", ".join(f"{k.upper()} ≤ {v:g} ms" for k, v in slos.items()))
        totals.append(f'<tr><th>{_label(key, TOTAL_LABELS[key])}</th><td data-key="{key}">{html.escape(shown)}</td>'
                      '</tr>')
    return (f'<div id="bench-table-wrap"><table class="bench-table"><thead><tr><th>latency</th>{head}</tr></thead>'
            f'<tbody>{latency_rows}</tbody></table><table class="bench-table totals"><tbody>{"".join(totals)}'
            f'</tbody></table>{surge_table_html(report)}</div>')


HISTORY_KEYS = (("output_throughput", "higher"), ("request_throughput", "higher"), ("request_goodput", "higher"),
                ("mean_ttft_ms", "lower"), ("p99_ttft_ms", "lower"), ("mean_tpot_ms", "lower"),
                ("p99_itl_ms", "lower"), ("prefix_cache_hit_rate", "higher"))


HISTORY_LABELS = {**TOTAL_LABELS, "mean_ttft_ms": "TTFT, mean", "p99_ttft_ms": "TTFT, p99",
                  "mean_tpot_ms": "TPOT, mean", "p99_itl_ms": "ITL, p99"}


def history_table_html(runs: list) -> str:
    """Selected runs of this session side by side, each with its ratio to the first one."""
    if not runs:
        return '<div class="run-note">no earlier runs selected</div>'
    head = "".join(f'<th title="{html.escape(run.label)}">run {run.number}</th>' for run in runs)
    rows = []
    for key, better in HISTORY_KEYS:
        base = runs[0].report[key] if applies(key, runs[0].report["config"]) else None
        cells = []
        for index, run in enumerate(runs):
            if not applies(key, run.report["config"]):
                cells.append(f"<td>{NOT_APPLICABLE}</td>")
                continue
            value = run.report[key]
            noise = noise_reason(key, None, None, rounds=1)  # each run is one measurement: no spread to judge by
            ratio = ratio_html(value / base, better, noise) if index and value is not None and base else ""
            cells.append(f"<td>{format_figure(key, value)} {ratio}</td>")
        rows.append(f"<tr><th>{_label(key, HISTORY_LABELS[key])}</th>{''.join(cells)}</tr>")
    legend = "".join(f'<div class="cmp-config"><b>run {run.number}</b> {html.escape(run.label)}</div>' for run in runs)
    return (f'<div id="bench-history-wrap">{legend}<table class="bench-table history"><thead><tr><th>figure</th>'
            f'{head}</tr></thead><tbody>{"".join(rows)}</tbody></table><div class="run-note">ratios to run '
            f'{runs[0].number}; a timing ratio between single runs reads "within noise" (repeat the workload, or use '
            'Compare with several rounds, to tell better from worse)</div></div>')
