"""The live charts beside the chat: data frames of the time series, drawn as SVG (`svg_lines`), and small HTML
bar charts for the rest.

Every chart is a pure function of what the engine reports (per-step history, stats), of the
session's own turns, or of the session's own activity, so it can be recomputed at any moment
while tokens stream. Engine-wide charts say so ("all sessions on this engine") and draw this
session's own requests as a separate series, because an engine batches every session that uses
its configuration. Times are seconds relative to "now" over a sliding window, as a serving
dashboard shows them.

TTFT per turn and memory are bars, not lines: their labels (configuration, prompt length; values
that differ by orders of magnitude) must be readable in full, which axis ticks cannot do.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import pandas as pd

from engine import EngineStats, StepRecord
from playground.figures.svg_lines import Axes, chart_box, line_svg
from playground.figures.units import format_bytes
from playground.shared.activity import SessionActivity

WINDOW_S = 60.0
BIN_S = 1.0
# Tokens per second is a rate over a sliding window, drawn every RATE_STEP_S: the tokens in the last RATE_WINDOW_S
# over the time in it that their source was active (the engine stepping, this session's request running), so a
# reply shorter than the window plots its own rate, not its token count. Activity less than ACTIVE_GAP_S apart is
# one span (the gaps between an engine's steps are part of its work).
RATE_WINDOW_S = 1.0
RATE_STEP_S = 0.25
SLOT_S = 0.05
ACTIVE_GAP_S = 0.1
MAX_TTFT_ROWS = 8
ALL_SESSIONS = "all sessions on this engine"


X_TITLE = "time (s, 0 = now)"


@dataclass(frozen=True)
class ChartSpec:
    """How one time-series chart is drawn: its element name, title, value column, axes and fixed series colours."""

    name: str
    title: str
    y: str
    axes: Axes
    series: dict[str, str]  # series name -> colour


def _axes(y_title: str, integer_y: bool = False) -> Axes:
    return Axes(X_TITLE, y_title, x_low=-WINDOW_S, x_high=0.0, integer_y=integer_y, width=400)


THROUGHPUT = ChartSpec("throughput", f"Tokens per second · {RATE_WINDOW_S:g} s sliding window, over the time each "
                       f"was active · {ALL_SESSIONS}", "tokens_per_s",
                       _axes(f"tokens / s ({RATE_WINDOW_S:g} s window)"),
                       {"prefill (all)": "#a5b4fc", "decode (all)": "#4f46e5", "this session": "#f97316"})
KV_BLOCKS = ChartSpec("kv_blocks", f"KV cache blocks in use · {ALL_SESSIONS}", "blocks", _axes("blocks (#)", True),
                      {"in use (all)": "#0d9488"})
BATCH = ChartSpec("batch", f"Running sequences · {ALL_SESSIONS}", "sequences", _axes("sequences (#)", True),
                  {"running (all)": "#4f46e5", "this session": "#f97316"})
SPECULATIVE = ChartSpec("spec_chart", f"Speculative acceptance · {ALL_SESSIONS}", "acceptance",
                        _axes("accepted / proposed"), {"acceptance (all)": "#7c3aed"})
LINE_CHARTS = (THROUGHPUT, KV_BLOCKS, BATCH, SPECULATIVE)


def _typed(rows: list[dict], dtypes: dict) -> pd.DataFrame:
    """A frame with fixed column types, so an empty first frame does not make an axis categorical."""
    return pd.DataFrame(rows, columns=list(dtypes)).astype(dtypes)


def empty_frame(spec: ChartSpec) -> pd.DataFrame:
    """A chart's frame before anything ran."""
    return _typed([], {"time_s": float, spec.y: float, "series": object})


def _bin_starts() -> list[float]:
    """Start of each time bin, relative to now: -WINDOW_S ... -BIN_S."""
    count = int(WINDOW_S / BIN_S)
    return [-(count - i) * BIN_S for i in range(count)]


def _bin_index(t: float, now: float) -> int | None:
    age = now - t
    if age < 0 or age >= WINDOW_S:
        return None
    return int(WINDOW_S / BIN_S) - 1 - int(math.floor(age / BIN_S))


def _series_frame(series: dict[str, list[float]], value: str) -> pd.DataFrame:
    starts = _bin_starts()
    rows = [{"time_s": x + BIN_S, value: v, "series": name}
            for name, values in series.items() for x, v in zip(starts, values, strict=True)]
    return _typed(rows, {"time_s": float, value: float, "series": object})


def _active_spans(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intervals merged where they overlap or lie less than ACTIVE_GAP_S apart."""
    spans: list[list[float]] = []
    for start, end in sorted(intervals):
        if spans and start - spans[-1][1] < ACTIVE_GAP_S:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    return [(start, end) for start, end in spans]


def _windowed_rates(events: list[tuple[float, float]], spans: list[tuple[float, float]], now: float) -> list[float]:
    """Tokens per active second over each sliding window of the chart, from (time, tokens) events and active
    spans: events and active time are summed in SLOT_S slots, then over the RATE_WINDOW_S ending at each point."""
    count, start = round(WINDOW_S / SLOT_S), now - WINDOW_S
    tokens, active = [0.0] * count, [0.0] * count
    for time, amount in events:
        index = math.ceil((time - start) / SLOT_S) - 1  # a slot holds the events in (its start, its end]
        if 0 <= index < count:
            tokens[index] += amount
    for low, high in spans:
        low, high = max(low, start), min(high, now)
        first, last = max(int((low - start) / SLOT_S), 0), min(math.ceil((high - start) / SLOT_S), count)
        for index in range(first, last):
            slot_start = start + index * SLOT_S
            active[index] += max(0.0, min(high, slot_start + SLOT_S) - max(low, slot_start))
    per_window, per_point = round(RATE_WINDOW_S / SLOT_S), round(RATE_STEP_S / SLOT_S)
    rates = []
    for end in range(per_window, count + 1, per_point):
        seconds = sum(active[end - per_window:end])
        rates.append(sum(tokens[end - per_window:end]) / seconds if seconds > 1e-9 else 0.0)
    return rates


def _rate_times() -> list[float]:
    """Where the rate is drawn: the end of each sliding window, relative to now."""
    per_window, per_point = round(RATE_WINDOW_S / SLOT_S), round(RATE_STEP_S / SLOT_S)
    return [-WINDOW_S + end * SLOT_S for end in range(per_window, round(WINDOW_S / SLOT_S) + 1, per_point)]


def throughput_frame(steps: list[StepRecord], activity: SessionActivity, now: float) -> pd.DataFrame:
    """Prefill and decode tokens per second of the whole engine, and this session's output tokens per second, each
    over a sliding window and the time in it its source was active (see RATE_WINDOW_S)."""
    engine_spans = _active_spans([(step.time - step.duration, step.time) for step in steps])
    decode = [(step.time, step.num_decode_tokens) for step in steps]
    prefill = [(step.time, max(step.num_tokens - step.num_decode_tokens, 0)) for step in steps]
    mine = _active_spans([(begin, now if end is None else end) for begin, end in activity.requests])
    series = {name: _windowed_rates(events, spans, now) for name, events, spans in zip(
        THROUGHPUT.series, (prefill, decode, activity.token_events), (engine_spans, engine_spans, mine), strict=True)}
    rows = [{"time_s": time, THROUGHPUT.y: rate, "series": name}
            for name, rates in series.items() for time, rate in zip(_rate_times(), rates, strict=True)]
    return _typed(rows, {"time_s": float, THROUGHPUT.y: float, "series": object})


def batch_frame(steps: list[StepRecord], activity: SessionActivity, now: float) -> pd.DataFrame:
    """The largest running batch in each time bin, and how many of this session's requests were running."""
    starts = _bin_starts()
    sizes, mine = [0.0] * len(starts), [0.0] * len(starts)
    for step in steps:
        index = _bin_index(step.time, now)
        if index is not None:
            sizes[index] = max(sizes[index], step.batch_size)
    for index, start in enumerate(starts):
        low, high = now + start, now + start + BIN_S
        mine[index] = sum(1 for begin, end in activity.requests if begin < high and (end is None or end >= low))
    names = list(BATCH.series)
    return _series_frame(dict(zip(names, (sizes, mine), strict=True)), BATCH.y)


def speculative_frame(steps: list[StepRecord], now: float) -> pd.DataFrame:
    """Accepted / proposed speculative tokens of the whole engine in each time bin that verified proposals
    (bins without any are left out, not drawn as zero)."""
    count = len(_bin_starts())
    proposed, accepted = [0] * count, [0] * count
    for step in steps:
        index = _bin_index(step.time, now)
        if index is not None and step.spec_proposed:
            proposed[index] += step.spec_proposed
            accepted[index] += step.spec_accepted
    name = next(iter(SPECULATIVE.series))
    rows = [{"time_s": start + BIN_S, SPECULATIVE.y: a / p, "series": name}
            for start, p, a in zip(_bin_starts(), proposed, accepted, strict=True) if p]
    return _typed(rows, {"time_s": float, SPECULATIVE.y: float, "series": object})


def speculative_label(steps: list[StepRecord]) -> str:
    """The chart's title with the window's tokens per verification step: output tokens over the sequences
    that verified proposals (1 = speculation gained nothing)."""
    verifying = [step for step in steps if step.spec_proposed]
    sequences = sum(step.num_decode_tokens - step.spec_proposed for step in verifying)
    if not sequences:
        return SPECULATIVE.title
    per_step = sum(step.num_output_tokens for step in verifying) / sequences
    return f"{SPECULATIVE.title} · {per_step:.2f} tokens per verification step (last {WINDOW_S:.0f} s)"


def kv_samples_with(samples: list[dict], stats: EngineStats, now: float, source: object) -> list[dict]:
    """The KV block chart's samples with one more taken from `stats` now: only those of the same `source` (the
    serving engine's configuration) within the window, so a configuration change starts a new line instead of
    drawing the previous engine's blocks beside the new one's."""
    kept = [s for s in samples if s["source"] == source and now - s["time"] < WINDOW_S]
    return [*kept, {"time": now, "used": stats.kv_blocks_used, "total": stats.kv_blocks_total, "source": source}]


def kv_blocks_frame(samples: list[dict], now: float) -> pd.DataFrame:
    """Blocks in use over the last WINDOW_S seconds (the allocation, usually far larger, is in the chart's label)."""
    rows = [{"time_s": -(now - s["time"]), "blocks": s["used"], "series": "in use (all)"}
            for s in samples if 0 <= now - s["time"] < WINDOW_S]
    return _typed(rows, {"time_s": float, "blocks": float, "series": object})


def kv_blocks_label(samples: list[dict]) -> str:
    total = samples[-1]["total"] if samples else 0
    return f"KV cache blocks in use · of {total} allocated · {ALL_SESSIONS}" if total else KV_BLOCKS.title


def line_chart_html(spec: ChartSpec, frame: pd.DataFrame, title: str | None = None,
                    engine_label: str | None = None) -> str:
    """One time-series chart (HTML): `frame`'s series over the window, each in its fixed colour (a series without
    points this time keeps its place in the legend), under a line naming the engine it plots (`engine_label`, the
    configuration's label), so that a configuration change shows in every chart."""
    lines = {name: list(zip(rows["time_s"], rows[spec.y], strict=True))
             for name, rows in frame.groupby("series", sort=False)}
    subtitle = f"engine: {engine_label}" if engine_label else None
    return chart_box(title or spec.title, line_svg(spec.axes, lines, spec.series, title or spec.title), spec.series,
                     subtitle)


# ----- HTML charts --------------------------------------------------------------------------


def _bar(fraction: float, css_class: str) -> str:
    width = max(0.0, min(fraction, 1.0)) * 100
    return f'<span class="bar {css_class}" style="width:{width:.2f}%"></span>'


def ttft_html(turns: list[dict]) -> str:
    """This session's recent turns, one row each: configuration, prompt length (cached part) and two bars,
    the engine's TTFT (dark) inside the whole wait until the first text showed (light)."""
    rows = turns[-MAX_TTFT_ROWS:]
    head = ('<div class="hchart-title">Time to first token · this session\'s turns</div>'
            '<div class="hchart-legend"><span class="key engine"></span>engine TTFT '
            '<span class="key wait"></span>Enter → first text on screen (server → text for API calls)</div>')
    if not rows:
        return f'<div class="hchart" id="ttft-chart">{head}<div class="hchart-empty">no turns yet</div></div>'
    waits = [t.get("visible_ttft_ms") or t.get("first_text_ms") or 0 for t in rows]
    scale = max([*waits, *(t.get("engine_ttft_ms") or 0 for t in rows), 1.0])
    body = []
    for turn, wait in zip(rows, waits, strict=True):
        engine = turn.get("engine_ttft_ms")
        prompt = f"prompt {turn['prompt_tokens']} tok ({turn['cached_tokens']} cached)"
        where = "client" if turn.get("measured_at") == "client" else "engine"  # a served model's TTFT is the client's
        values = (f"{engine:.0f} ms {where}" if engine is not None else "no token") + (
            f" · {wait:.0f} ms to text" if wait else "")
        body.append(
            f'<div class="hrow" data-turn="{turn["number"]}">'
            f'<div class="hlabel"><b>#{turn["number"]}</b> {html.escape(turn["config"])} · {prompt}</div>'
            f'<div class="htrack">{_bar(wait / scale, "wait")}{_bar((engine or 0) / scale, "engine")}</div>'
            f'<div class="hvalue">{values}</div></div>')
    return f'<div class="hchart" id="ttft-chart">{head}{"".join(body)}</div>'


def memory_html(stats: EngineStats | None, process_rss: int | None, config_label: str,
                served_by: str | None = None) -> str:
    """This engine's memory on one linear scale (weights, KV allocated; KV in use as a share of the
    allocation, so a few blocks stay visible), then the whole process's figures apart. A model `served_by` another
    server keeps its memory there, out of this client's sight: said, not drawn as zeros."""
    title = '<div class="hchart-title">Memory · this engine</div>'
    if stats is None or stats.closed:
        return f'<div class="hchart" id="memory-chart">{title}<div class="hchart-empty">engine not loaded</div></div>'
    if served_by:
        return (f'<div class="hchart" id="memory-chart">{title}<div class="hchart-empty">the weights and KV cache are '
                f'on the server at {html.escape(served_by)}: not visible from this client</div></div>')
    weights, allocated, used = stats.weights_bytes, stats.kv_cache_bytes, stats.kv_cache_used_bytes
    scale = max(weights, allocated, 1)
    share = used / allocated if allocated else 0.0
    rows = [
        ("weights", _bar(weights / scale, "weights"), format_bytes(weights)),
        ("KV allocated", _bar(allocated / scale, "kv"), format_bytes(allocated)),
        ("KV in use", _bar(max(share, 0.01 if used else 0.0), "kvused"),
         f"{format_bytes(used)} · {share:.1%} of allocated"),
    ]
    body = "".join(f'<div class="hrow mem"><div class="hlabel">{name}</div><div class="htrack">{bar}</div>'
                   f'<div class="hvalue">{value}</div></div>' for name, bar, value in rows)
    blocks = (f'{stats.kv_blocks_used} of {stats.kv_blocks_total} blocks in use') if stats.kv_blocks_total else ""
    process = (f'process (every engine in the pool + the app): peak {format_bytes(stats.peak_memory_bytes)}'
               + (f' · now {format_bytes(process_rss)} resident' if process_rss else ""))
    footer = (f'<div class="hchart-note">{html.escape(config_label)}{" · " + blocks if blocks else ""}'
              f'<br>{html.escape(process)}<br>'
              'activation peak: not reported per engine (it is inside the process peak)</div>')
    return f'<div class="hchart" id="memory-chart">{title}{body}{footer}</div>'
