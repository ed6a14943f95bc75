"""A surge workload's figures: each request class apart, and the chat users' token gaps split by the surge.

Why: prefill/decode disaggregation exists so that a burst of long prompts does not stall the users who are
decoding. Run-wide figures blur that (the burst's TTFTs and the chat users' gaps land in one distribution), so a
run with a surge (`WorkloadSpec.surge`) reports each class apart (`chat_*`, `surge_*`: the summary's own keys),
splits the chat users' inter-token gaps into those during the surge and outside it, and sets the first against
the same chat users run alone (`reference_figures`): `chat_p99_itl_surge_ratio` is the headline figure.

The surge window runs from the first surge request's submission to the last surge request's first token: while
it is open, some surge prompt waits for or is in its prefill, which is what can stall the decoding users. A chat
gap between tokens at times a < b is *during* the surge when it overlaps the window (b > start and a < end), else
*outside* it. Times are on the bench's clock: a request's submission, plus its TTFT, plus its gaps. The command
and every key: docs/benchmarks.md, "Surge workload".
"""

from __future__ import annotations

from itertools import accumulate

from engine.core.metrics import RequestMetrics, latency_figures, summarize
from engine.core.request import RequestOutput
from engine.tools.workloads import CHAT, SURGE, BenchRequest

# what the bench's table shows of a surge run, and sets compare / base ratios for (the cost of disaggregation in
# each class's TTFT, its gain in the chat users' gaps during the surge)
SURGE_TABLE_KEYS = ["chat_completed", "chat_median_ttft_ms", "chat_p99_ttft_ms", "chat_median_itl_ms",
                    "chat_p99_itl_ms", "chat_p99_itl_outside_surge_ms", "chat_median_itl_during_surge_ms",
                    "chat_p99_itl_during_surge_ms", "chat_itl_during_surge_count", "chat_p99_itl_no_surge_ms",
                    "chat_p99_itl_surge_ratio", "chat_output_throughput", "surge_completed", "surge_median_ttft_ms",
                    "surge_p99_ttft_ms", "surge_p99_itl_ms", "surge_median_e2el_ms", "surge_total_token_throughput",
                    "surge_window_start_s", "surge_window_end_s"]
SURGE_RATIO_KEYS = ["chat_median_ttft_ms", "chat_p99_ttft_ms", "surge_median_ttft_ms", "surge_p99_ttft_ms",
                    "chat_p99_itl_during_surge_ms"]

Timed = list[tuple[float, RequestMetrics]]  # (submission time, metrics) of each finished request of a class


def token_times(sent: float, metrics: RequestMetrics) -> list[float]:
    """A finished request's token times: its submission, plus its TTFT, plus each gap."""
    if metrics.ttft is None:
        return []
    return list(accumulate(metrics.itl, initial=sent + metrics.ttft))


def surge_window(surge: Timed) -> tuple[float, float] | None:
    """(first surge submission, last surge first token); None when no surge request produced a token."""
    firsts = [sent + metrics.ttft for sent, metrics in surge if metrics.ttft is not None]
    return (min(sent for sent, _ in surge), max(firsts)) if firsts else None


def split_gaps(chat: Timed, window: tuple[float, float]) -> tuple[list[float], list[float]]:
    """The chat requests' gaps (seconds) that overlap the window, and the others."""
    start, end = window
    during, outside = [], []
    for sent, metrics in chat:
        times = token_times(sent, metrics)
        for before, after, gap in zip(times, times[1:], metrics.itl, strict=False):
            (during if after > start and before < end else outside).append(gap)
    return during, outside


def _gap_figures(name: str, gaps: list[float]) -> dict:
    """`chat_*_{name}_ms` figures and their count; None rather than 0 when there is no gap to describe."""
    figures = latency_figures(name, gaps) if gaps else dict.fromkeys(latency_figures(name, []))
    return {f"chat_{key}": value for key, value in figures.items()} | {f"chat_{name}_count": len(gaps)}


def _class_summary(label: str, timed: Timed, goodput_slos: dict[str, float] | None) -> dict:
    """The run summary's figures for one class, prefixed with its label; its duration runs from the class's first
    submission to its last token."""
    ends = [sent + metrics.e2el for sent, metrics in timed if metrics.e2el is not None]
    duration = max(ends) - min(sent for sent, _ in timed) if ends else 0.0
    summary = summarize([metrics for _, metrics in timed], duration, goodput_slos)
    return {f"{label}_{key}": value for key, value in summary.items()}


def class_figures(requests: list[BenchRequest], outputs: list[RequestOutput | None], sent_at: list[float | None],
                  goodput_slos: dict[str, float] | None = None) -> dict:
    """Each class's summary (`chat_*`, `surge_*`), the surge window (seconds from the run's first submission) and
    the chat users' gaps during and outside it (`chat_*_itl_during_surge_ms`, `chat_*_itl_outside_surge_ms`)."""
    classes: dict[str, Timed] = {CHAT: [], SURGE: []}
    for request, output, sent in zip(requests, outputs, sent_at, strict=True):
        if output is not None and output.finish_reason != "cancelled":
            classes[request.label].append((sent, output.metrics))
    figures = {}
    for label, timed in classes.items():
        figures.update(_class_summary(label, timed, goodput_slos))
    window = surge_window(classes[SURGE])
    if window is None:
        return figures
    during, outside = split_gaps(classes[CHAT], window)
    first_sent = min(sent for sent in sent_at if sent is not None)
    return {**figures, "surge_window_start_s": window[0] - first_sent, "surge_window_end_s": window[1] - first_sent,
            **_gap_figures("itl_during_surge", during), **_gap_figures("itl_outside_surge", outside)}


def reference_figures(surged: dict, alone: dict) -> dict:
    """A surge run's figures against the same chat requests run alone (`alone`, kept whole under `no_surge`): the
    chat users' gaps then, and the headline ratio, p99 gap during the surge / p99 gap alone (1.0: no slowdown)."""
    during, alone_p99 = surged.get("chat_p99_itl_during_surge_ms"), alone["p99_itl_ms"]
    return {"chat_median_itl_no_surge_ms": alone["median_itl_ms"], "chat_p99_itl_no_surge_ms": alone_p99,
            "chat_p99_itl_surge_ratio": during / alone_p99 if during is not None and alone_p99 else None,
            "no_surge": alone}


def headline(result: dict) -> str:
    """One line: the chat users' p99 gap during the surge, alone, and their ratio."""
    during, alone, ratio = (result.get(key) for key in (
        "chat_p99_itl_during_surge_ms", "chat_p99_itl_no_surge_ms", "chat_p99_itl_surge_ratio"))
    if during is None or ratio is None:
        return "no chat gap overlapped the surge (or no surge request produced a token): no ratio"
    return (f"chat p99 ITL {during:.2f} ms during the surge vs {alone:.2f} ms without it: {ratio:.2f}x; surge p99 "
            f"TTFT {result['surge_p99_ttft_ms']:.1f} ms, chat p99 TTFT {result['chat_p99_ttft_ms']:.1f} ms")
