"""Metric definitions shared by the engine, the bench and the UI (docs/metrics.md).

Per request, from its arrival: TTFT = first token - arrival; E2EL = last token - arrival;
TPOT = (E2EL - TTFT) / (output tokens - 1); ITL = each gap between consecutive tokens.
Goodput (vLLM's `request_goodput`) = completed requests that met every latency objective / duration.
Memory is counted from tensor storage and the process, never from `get_memory_footprint`.
"""

from __future__ import annotations

import os
import platform
import resource
from dataclasses import dataclass, field

import psutil
import torch

from engine.errors import ConfigError


@dataclass
class RequestMetrics:
    """Latency and token counts of one request, derived from its timestamps."""

    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    ttft: float | None = None
    tpot: float | None = None
    e2el: float | None = None
    itl: list[float] = field(default_factory=list)
    spec_proposed: int = 0  # speculative tokens verified for this request, how many were accepted,
    spec_accepted: int = 0  # and in how many verification steps (accepted / drafts = tokens gained per step)
    spec_drafts: int = 0
    guided_mask_s: float = 0.0     # this request's share of the measured grammar-mask work (compute + apply), seconds
    guided_compile_s: float = 0.0  # its grammar's compile time (0 when the compiled grammar came from the cache)
    kv_transfer_bytes: int = 0     # disaggregation: its K/V moved from the prefill worker to the decode worker,
    kv_transfer_s: float = 0.0     # and the workers' seconds on those moves (copy out, receive and copy in)

    @classmethod
    def from_timestamps(cls, arrival: float, token_times: list[float], prompt_tokens: int,
                        cached_tokens: int = 0, spec_proposed: int = 0, spec_accepted: int = 0,
                        spec_drafts: int = 0, with_itl: bool = True) -> RequestMetrics:
        """`with_itl=False` leaves `itl` empty: O(1) running figures for a stream still in progress."""
        metrics = cls(prompt_tokens=prompt_tokens, output_tokens=len(token_times), cached_tokens=cached_tokens,
                      spec_proposed=spec_proposed, spec_accepted=spec_accepted, spec_drafts=spec_drafts)
        if token_times:
            metrics.ttft = token_times[0] - arrival
            metrics.e2el = token_times[-1] - arrival
            if with_itl:
                metrics.itl = [b - a for a, b in zip(token_times, token_times[1:], strict=False)]
            if len(token_times) > 1:
                metrics.tpot = (metrics.e2el - metrics.ttft) / (len(token_times) - 1)
        return metrics


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), 0.0 for an empty list."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def check_goodput_slos(slos: dict[str, float]) -> dict[str, float]:
    """`slos` if every key is a goodput metric and every objective a positive number of milliseconds."""
    for name, limit in slos.items():
        if name not in GOODPUT_METRICS:
            raise ConfigError(f"goodput objectives are for {', '.join(GOODPUT_METRICS)}; got {name!r}")
        if isinstance(limit, bool) or not isinstance(limit, int | float) or not 0 < limit < float("inf"):
            raise ConfigError(f"the goodput objective for {name} must be a positive number of ms, got {limit!r}")
    return slos


def meets_slos(metrics: RequestMetrics, slos: dict[str, float]) -> bool:
    """Whether a request met every service-level objective in `slos` (milliseconds per metric name).

    vLLM's rule: a request is good when each named metric is at most its objective; a request with a
    single output token has no TPOT and counts as 0 for it.
    """
    values = {"ttft": metrics.ttft, "tpot": metrics.tpot or 0.0, "e2el": metrics.e2el}
    return all(values[name] is not None and values[name] * 1000.0 <= limit for name, limit in slos.items())


def summarize(metrics: list[RequestMetrics], duration: float, goodput_slos: dict[str, float] | None = None) -> dict:
    """Aggregate figures over finished requests, with vLLM's benchmark key names.

    `request_goodput` (vLLM's name and definition) is the completed requests that met every objective
    of `goodput_slos` (milliseconds for any of ttft, tpot, e2el) per second of the run; None without
    objectives.
    """
    check_goodput_slos(goodput_slos or {})
    completed = [m for m in metrics if m.output_tokens > 0]
    prompt_tokens = sum(m.prompt_tokens for m in completed)
    output_tokens = sum(m.output_tokens for m in completed)
    summary = {
        "completed": len(completed),
        "duration": duration,
        "total_input_tokens": prompt_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(completed) / duration if duration else 0.0,
        "request_goodput": (sum(meets_slos(m, goodput_slos) for m in completed) / duration if duration else 0.0)
        if goodput_slos else None,
        "output_throughput": output_tokens / duration if duration else 0.0,
        "total_token_throughput": (prompt_tokens + output_tokens) / duration if duration else 0.0,
    }
    series = {
        "ttft": [m.ttft for m in completed if m.ttft is not None],
        "tpot": [m.tpot for m in completed if m.tpot is not None],
        "itl": [gap for m in completed for gap in m.itl],
        "e2el": [m.e2el for m in completed if m.e2el is not None],
    }
    for name, values in series.items():
        summary.update(latency_figures(name, values))
    return summary


def latency_figures(name: str, seconds: list[float]) -> dict:
    """Mean, median, p90 and p99 of `seconds` in milliseconds, under vLLM's key names (`p99_{name}_ms`); 0.0 for an
    empty list. Shared by the run-wide summary and the surge workload's split of the chat users' gaps."""
    millis = [v * 1000.0 for v in seconds]
    return {f"mean_{name}_ms": sum(millis) / len(millis) if millis else 0.0,
            f"median_{name}_ms": percentile(millis, 50),
            f"p90_{name}_ms": percentile(millis, 90),
            f"p99_{name}_ms": percentile(millis, 99)}


def peak_memory_bytes(device: str) -> int:
    """Peak process memory: CUDA allocator peak on a GPU, peak resident set size on a CPU."""
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_device() -> str:
    """One line naming the hardware the engine runs on, for the UI header and bench output."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return f"GPU: {props.name} ({props.total_memory / 2**30:.1f} GiB)"
    ram = psutil.virtual_memory().total / 2**30
    return f"CPU: {_cpu_name()} ({os.cpu_count()} cores), {ram:.1f} GiB RAM"
