"""What the loaded engine's optimizations cost and gain, beside the chat: one HTML panel.

Why: a faster or smaller configuration is only a win if its quality holds, so the panel puts the held-out
perplexity beside the weights' bytes (before and after quantization), and, where those features are on,
speculative decoding's acceptance (overall, tokens per verification step, by proposal position), tensor
parallelism's communication share per rank, pipeline parallelism's bubble with a timeline of its stages, and
disaggregation's per-worker utilisation and K/V moves.
Everything comes from the engine's public figures (`stats()`, `info`, `held_out_perplexity`) and
`estimate_memory`; the functions are pure, so tests compare what is shown with what the engine reports.
"""

from __future__ import annotations

import functools
import html

from engine import EngineConfig, EngineInfo, EngineStats, PerplexityResult, estimate_memory
from playground.figures.units import format_bytes
from playground.figures.worker_timeline import Span, timeline_svg

TIMELINE_SPANS = 48  # the most recent stage spans drawn: a few steps' micro-batches, readable at panel width


@functools.lru_cache(maxsize=64)
def unquantized_weights_bytes(config: EngineConfig) -> int | None:
    """The weights' bytes of `config` without its quantization (`estimate_memory`, before loading), or None."""
    try:
        return estimate_memory(config.replace(quantization="none")).weights_bytes
    except Exception:  # a configuration the estimate cannot size (e.g. a hub model not cached here): say nothing
        return None


def _row(name: str, value: str, title: str = "") -> str:
    tip = f' title="{html.escape(title)}"' if title else ""
    return f'<div class="feat-row"{tip}><span class="feat-k">{html.escape(name)}</span>' \
           f'<span class="feat-v">{html.escape(value)}</span></div>'


def quality_row(perplexity: PerplexityResult | None, status: str | None = None,
                reference: PerplexityResult | None = None) -> str:
    """Held-out perplexity once measured, beside the model's float32 reference; otherwise what to do (or why it
    cannot be measured)."""
    if perplexity is not None:
        value = (f"{perplexity.perplexity:.3f} on {perplexity.tokens:,} tokens "
                 f"({perplexity.seconds:.1f} s)")
        if reference is not None:
            value += (f" · float32 reference {reference.perplexity:.3f} "
                      f"({perplexity.perplexity / reference.perplexity:.2f}x)")
    else:
        value = status or "not measured yet: press Measure perplexity"
    return _row("held-out perplexity", value, "exp of the mean next-token loss on the demo model's held-out text, "
                "through this engine's own forward pass: quantization and GQA damage show here (lower is better)")


def weights_row(stats: EngineStats, info: EngineInfo, unquantized: int | None) -> str:
    """The weights' real bytes and, when quantized, the same model's bytes without quantization."""
    weights, level = stats.weights_bytes, info.quantization
    if level == "none":
        return _row("weights", f"{format_bytes(weights)} in {info.dtype} (not quantized)")
    before = (f"{format_bytes(unquantized)} before quantization → {format_bytes(weights)} as {level} "
              f"({weights / unquantized:.2f}x)") if unquantized else f"{format_bytes(weights)} as {level}"
    return _row("weights", before, "real storage of the quantized weights (packed values and scales), against the "
                "same configuration's weights without quantization (estimated before loading)")


def speculative_rows(stats: EngineStats) -> list[str]:
    """Acceptance since the engine loaded: overall, tokens per verification step, and by proposal position."""
    drafts, proposed = stats.spec_num_drafts, stats.spec_num_draft_tokens
    if not drafts:
        return [_row("speculative", "no proposals verified yet")]
    accepted = stats.spec_num_accepted_tokens
    positions = " / ".join(f"{count / drafts:.0%}" for count in stats.spec_accepted_per_position)
    return [_row("spec acceptance", f"{accepted / proposed:.0%} ({accepted:,} of {proposed:,} proposed) · "
                 f"{1 + accepted / drafts:.2f} tokens per verification step",
                 "accepted / proposed speculative tokens since the engine loaded (all sessions), and the tokens "
                 "each verification step produced: its accepted proposals plus the target's own token"),
            _row("accepted by position", positions, "how often the 1st, 2nd, ... proposal of a step was accepted")]


def tensor_parallel_rows(stats: EngineStats) -> list[str]:
    """Rank 0's share of step time in collectives, then each rank's bytes and time in collectives."""
    executor = stats.executor_seconds
    rows = [_row("TP communication", f"{stats.collective_share:.0%} of step time in all-reduce / "
                 f"all-gather on rank 0 ({stats.collective_seconds:.2f} of {executor:.2f} s)",
                 "time inside collectives, waiting for the slower rank included")]
    for rank, (weights, kv, seconds) in enumerate(zip(stats.rank_weights_bytes, stats.rank_kv_cache_bytes,
                                                      stats.rank_collective_seconds, strict=True)):
        share = f"{seconds / executor:.0%}" if executor else "n/a"
        rows.append(_row(f"rank {rank}", f"weights {format_bytes(weights)} · KV {format_bytes(kv)} · "
                                         f"collectives {seconds:.2f} s ({share})"))
    return rows


def pipeline_rows(stats: EngineStats) -> list[str]:
    """The measured bubble beside the textbook one, each stage's busy and idle time, the bytes between stages, and
    the latest micro-batches as a timeline (the gaps are the bubble)."""
    pipeline = stats.pipeline
    if pipeline is None or not pipeline.micro_batches_run:
        return [_row("pipeline", "no micro-batch has run yet")]
    rows = [_row("pipeline bubble", f"{pipeline.bubble_share:.0%} measured · {pipeline.textbook_bubble_share:.0%} "
                 f"textbook (N-1)/(m+N-1), {pipeline.stages} stages, {pipeline.micro_batches} micro-batches, "
                 f"{pipeline.schedule}",
                 "share of the time work was in the pipeline that stages sat idle, waiting for input; the textbook "
                 "figure assumes equal micro-batches, free hand-overs and stages that never share a core")]
    for stage, (busy, idle) in enumerate(zip(pipeline.stage_busy_seconds, pipeline.stage_idle_seconds, strict=True)):
        rows.append(_row(f"stage {stage}", f"busy {busy:.2f} s · idle {idle:.2f} s"))
    rows.append(_row("between stages", f"{format_bytes(pipeline.bytes_between_stages)} of hidden states over "
                                       f"{pipeline.micro_batches_run:,} micro-batches"))
    recent = pipeline.timeline[-TIMELINE_SPANS:]
    spans = [Span(span.stage, span.start, span.end, span.micro_batch, f"micro-batch {span.micro_batch}")
             for span in recent]
    lanes = [f"stage {stage}" for stage in range(pipeline.stages)]
    rows.append(f'<div class="feat-chart">{timeline_svg(lanes, spans, "latest micro-batches")}</div>')
    return rows


def disaggregation_rows(stats: EngineStats) -> list[str]:
    """Each worker's utilisation and what it ran, then the K/V moved from the prefill worker to the decode worker."""
    rows = []
    for role, utilisation, busy, chunks, decode_rows, held in zip(
            stats.worker_roles, stats.worker_utilisation, stats.worker_busy_seconds, stats.worker_prefill_chunks,
            stats.worker_decode_rows, stats.worker_requests, strict=True):
        rows.append(_row(role, f"{utilisation:.0%} busy ({busy:.2f} s) · {chunks:,} prompt chunks · "
                               f"{decode_rows:,} decode rows · {held} request(s) now",
                         "busy seconds as the worker times its steps and transfers, over the wall time since the "
                         "first step; the decode worker runs no prompt chunk"))
    if stats.kv_transfers:
        rows.append(_row("K/V moved", f"{stats.kv_transfers:,} moves · {format_bytes(stats.kv_transfer_bytes)} in "
                         f"{stats.kv_transfer_seconds * 1000:.1f} ms · per request "
                         f"{format_bytes(int(stats.kv_transfer_bytes_per_request))}, "
                         f"{stats.kv_transfer_seconds_per_request * 1000:.2f} ms",
                         "K/V blocks sent from the prefill worker's pool to the decode worker's once a prompt is "
                         "computed, with the workers' own seconds on each move"))
    else:
        rows.append(_row("K/V moved", "no prompt has moved to the decode worker yet"))
    return rows


def served_rows(stats: EngineStats, info: EngineInfo) -> list[str]:
    """A served model (backend=remote): where it runs, and the server's own figures from its /metrics, each with the
    series it came from (or that it publishes none)."""
    rows = [_row("served by", info.device, "an OpenAI-compatible server: this client measures its replies' "
                 "latencies; quality (perplexity) needs the whole next-token distribution, which it does not send")]
    rows += [_row("server", note) for note in stats.notes]
    return rows


def features_html(config: EngineConfig | None, stats: EngineStats | None, info: EngineInfo | None,
                  perplexity: PerplexityResult | None, unquantized: int | None, status: str | None = None,
                  reference: PerplexityResult | None = None) -> str:
    """The panel: quality (beside the float32 reference) and weights always; speculative and tensor-parallel
    figures when those are on."""
    title = '<div class="hchart-title">Quality and optimizations · this engine</div>'
    if stats is None or stats.closed or info is None or config is None:
        return f'<div class="hchart" id="features-chart">{title}<div class="hchart-empty">engine not loaded</div></div>'
    if info.backend == "remote":
        return f'<div class="hchart" id="features-chart">{title}{"".join(served_rows(stats, info))}</div>'
    rows = [quality_row(perplexity, status, reference), weights_row(stats, info, unquantized)]
    if config.speculative != "off":
        rows += speculative_rows(stats)
    if stats.tensor_parallel_size > 1:
        rows += tensor_parallel_rows(stats)
    if stats.pipeline_parallel_size > 1:
        rows += pipeline_rows(stats)
    if stats.disaggregation != "off":
        rows += disaggregation_rows(stats)
    return f'<div class="hchart" id="features-chart">{title}{"".join(rows)}</div>'
