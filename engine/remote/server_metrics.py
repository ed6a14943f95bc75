"""A serving engine's own figures, from its Prometheus `/metrics` page, under one set of labels.

Why: the client measures latency from the outside; the queue, the KV cache's fill and the cache hits are only known
inside the server. vLLM, SGLang and llama.cpp's server each publish them under their own names; `MAPPING` says which
series means what, and each figure keeps its source series. Unknown series are left out. The parser reads the text
exposition format's sample lines (`name{labels} value [timestamp]`); a series with several label sets (one per model
or rank) is summed for counts and averaged for fractions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerFigure:
    """One figure the server reports: what it is, its value, and where it came from (server, series)."""

    label: str
    value: float
    source: str
    series: str


# label -> per server: (series, how the label sets combine); a ratio of two counters is (numerator, denominator).
MAPPING: dict[str, dict[str, tuple]] = {
    "requests running": {"vLLM": ("vllm:num_requests_running", "sum"), "SGLang": ("sglang:num_running_reqs", "sum"),
                         "llama.cpp": ("llamacpp:requests_processing", "sum")},
    "requests waiting": {"vLLM": ("vllm:num_requests_waiting", "sum"), "SGLang": ("sglang:num_queue_reqs", "sum"),
                         "llama.cpp": ("llamacpp:requests_deferred", "sum")},
    "KV cache usage (fraction)": {"vLLM": ("vllm:kv_cache_usage_perc", "mean"),
                                  "vLLM (before v1)": ("vllm:gpu_cache_usage_perc", "mean"),
                                  "SGLang": ("sglang:token_usage", "mean"),
                                  "llama.cpp": ("llamacpp:kv_cache_usage_ratio", "mean")},
    "prefix cache hit rate": {"vLLM": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
                              "vLLM (before v1)": ("vllm:gpu_prefix_cache_hit_rate", "mean"),
                              "SGLang": ("sglang:cache_hit_rate", "mean")},
    "speculative acceptance rate": {"vLLM": ("vllm:spec_decode_num_accepted_tokens_total",
                                             "vllm:spec_decode_num_draft_tokens_total")},
    "speculative accept length": {"SGLang": ("sglang:spec_accept_length", "mean")},
    "prompt throughput (tokens/s)": {"llama.cpp": ("llamacpp:prompt_tokens_seconds", "mean")},
    "generation throughput (tokens/s)": {"SGLang": ("sglang:gen_throughput", "sum"),
                                         "llama.cpp": ("llamacpp:predicted_tokens_seconds", "mean")},
}


def parse_samples(text: str) -> dict[str, list[float]]:
    """Each series' values (one per label set) in a Prometheus text page; comments and bad lines are skipped."""
    series: dict[str, list[float]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, rest = _split_name(line)
        fields = rest.split()
        if not name or not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        series.setdefault(name, []).append(value)
    return series


def _split_name(line: str) -> tuple[str, str]:
    """(series name, what follows its labels) of one sample line; label values may hold quoted braces."""
    brace, space = line.find("{"), line.find(" ")
    if brace == -1 or (space != -1 and space < brace):
        return (line[:space], line[space:]) if space != -1 else ("", "")
    quoted, escaped = False, False
    for index in range(brace + 1, len(line)):
        char = line[index]
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "}" and not quoted:
            return line[:brace], line[index + 1:]
    return "", ""


def map_figures(series: dict[str, list[float]]) -> list[ServerFigure]:
    """The known figures among `series`, in `MAPPING`'s order (a ratio only where its denominator is above 0)."""
    figures = []
    for label, sources in MAPPING.items():
        for source, (name, how) in sources.items():
            values = [v for v in series.get(name, []) if not math.isnan(v)]
            if not values:
                continue
            if how == "sum":
                value = sum(values)
            elif how == "mean":
                value = sum(values) / len(values)
            else:
                total = sum(v for v in series.get(how, []) if not math.isnan(v))
                if not total:
                    continue
                value, name = sum(values) / total, f"{name} / {how}"
            figures.append(ServerFigure(label, value, source, name))
            break
    return figures
