"""Data frames for the live charts beside the chat, and the axis labels that go with them.

Every chart is a pure function of what the engine reports (per-step history, stats) or of the
session's own turns, so it can be recomputed at any moment while tokens stream. Times are in
seconds relative to "now" over a sliding window, the way a serving dashboard shows them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from engine import StepRecord

WINDOW_S = 60.0
BIN_S = 1.0
MIB = 1024 * 1024


@dataclass(frozen=True)
class ChartSpec:
    """How one chart is drawn: columns and axis titles (with units)."""

    name: str
    kind: str  # "line" or "bar"
    title: str
    x: str
    y: str
    x_title: str
    y_title: str
    color: str | None = None


# No colour per configuration: gradio's plots fix their colour domain at first render, so a new
# configuration's bars would not show; the configuration is in each bar's tooltip instead.
TTFT = ChartSpec("ttft", "bar", "Time to first token per turn", "turn", "ttft_ms", "turn (#)", "TTFT (ms)")
THROUGHPUT = ChartSpec("throughput", "line", "Engine throughput", "time_s", "tokens_per_s",
                       "time (s, 0 = now)", "tokens / s", color="phase")
MEMORY_KINDS = ("weights", "KV allocated", "KV in use", "peak")
MEMORY = ChartSpec("memory", "bar", "Memory", "kind", "mib", "memory component", "memory (MiB)")
KV_BLOCKS = ChartSpec("kv_blocks", "line", "KV cache blocks", "time_s", "blocks",
                      "time (s, 0 = now)", "blocks (#)", color="series")
BATCH = ChartSpec("batch", "line", "Running batch size", "time_s", "sequences",
                  "time (s, 0 = now)", "sequences (#)")

ALL_CHARTS = (TTFT, THROUGHPUT, MEMORY, KV_BLOCKS, BATCH)


def _typed(rows: list[dict], dtypes: dict) -> pd.DataFrame:
    """A frame with fixed column types, so an empty first frame does not make an axis categorical."""
    return pd.DataFrame(rows, columns=list(dtypes)).astype(dtypes)


def ttft_frame(turns: list[dict]) -> pd.DataFrame:
    """One bar per chat turn, coloured by the configuration that served it."""
    rows = [{"turn": str(t["turn"]), "ttft_ms": t["ttft_ms"], "config": t["config"]}
            for t in turns if t.get("ttft_ms") is not None]
    return _typed(rows, {"turn": object, "ttft_ms": float, "config": object})


def _bin_starts() -> list[float]:
    """Start of each time bin, relative to now: -WINDOW_S ... -BIN_S."""
    count = int(WINDOW_S / BIN_S)
    return [-(count - i) * BIN_S for i in range(count)]


def _bin_index(t: float, now: float) -> int | None:
    age = now - t
    if age < 0 or age >= WINDOW_S:
        return None
    return int(WINDOW_S / BIN_S) - 1 - int(math.floor(age / BIN_S))


def throughput_frame(steps: list[StepRecord], now: float) -> pd.DataFrame:
    """Prefill and decode tokens per second, binned over the last WINDOW_S seconds."""
    starts = _bin_starts()
    prefill = [0.0] * len(starts)
    decode = [0.0] * len(starts)
    for step in steps:
        index = _bin_index(step.time, now)
        if index is None:
            continue
        decode_tokens = step.num_decode_tokens
        decode[index] += decode_tokens
        prefill[index] += max(step.num_tokens - decode_tokens, 0)
    rows = [{"time_s": x + BIN_S, "tokens_per_s": tokens / BIN_S, "phase": phase}
            for phase, series in (("prefill", prefill), ("decode", decode))
            for x, tokens in zip(starts, series, strict=True)]
    return _typed(rows, {"time_s": float, "tokens_per_s": float, "phase": object})


def batch_frame(steps: list[StepRecord], now: float) -> pd.DataFrame:
    """The largest running batch in each time bin (0 when the engine was idle)."""
    starts = _bin_starts()
    sizes = [0] * len(starts)
    for step in steps:
        index = _bin_index(step.time, now)
        if index is not None:
            sizes[index] = max(sizes[index], step.batch_size)
    rows = [{"time_s": x + BIN_S, "sequences": size} for x, size in zip(starts, sizes, strict=True)]
    return _typed(rows, {"time_s": float, "sequences": float})


def memory_frame(stats: dict | None) -> pd.DataFrame:
    """Weights, KV allocated, KV in use and peak process/GPU memory, in MiB."""
    kinds = zip(MEMORY_KINDS, ("weights_bytes", "kv_cache_bytes", "kv_cache_used_bytes", "peak_memory_bytes"),
                strict=True)
    rows = [{"kind": label, "mib": (stats.get(key) or 0) / MIB} for label, key in kinds] if stats else []
    return _typed(rows, {"kind": object, "mib": float})


def kv_sample(stats: dict, now: float) -> dict:
    """One point of the KV block chart, taken from engine stats."""
    total = stats.get("kv_blocks_total") or 0
    return {"time": now, "used": total - (stats.get("kv_blocks_free") or 0), "total": total}


def kv_blocks_frame(samples: list[dict], now: float) -> pd.DataFrame:
    """Blocks in use against blocks allocated, over the last WINDOW_S seconds."""
    rows = []
    for sample in samples:
        age = now - sample["time"]
        if 0 <= age < WINDOW_S:
            rows.append({"time_s": -age, "blocks": sample["used"], "series": "in use"})
            rows.append({"time_s": -age, "blocks": sample["total"], "series": "allocated"})
    return _typed(rows, {"time_s": float, "blocks": float, "series": object})


def trim_samples(samples: list[dict], now: float) -> list[dict]:
    return [s for s in samples if now - s["time"] < WINDOW_S]
