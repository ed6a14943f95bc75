"""A configuration in words: one line for the header, the pool and the tables, a short tag for chart rows,
and the check line that says whether it can run and what it would load.

Why one place: the header, the engine pool's list, Compare's columns, the benchmark's runs and the
chat's TTFT rows all name configurations, and they must name the same one the same way. Given the
loaded engine's `EngineInfo`, the `auto` choices read as what they resolved to.
"""

from __future__ import annotations

import html
from pathlib import Path

from engine import EngineConfig, EngineInfo
from playground.figures.units import format_bytes


def model_label(model: str) -> str:
    """A model as people name it: a curated name or hub id as is, a local folder by its name."""
    return Path(model).name if model.startswith(("/", ".", "~")) else model


def _kv_summary(config: EngineConfig, backend: str) -> str:
    """The KV cache as the backend that serves it really manages it."""
    if backend == "hf":
        if config.batching == "static":
            return "generate's own KV cache (per call)"
        sharing = " + block sharing" if config.prefix_caching else ""
        return f"transformers paged KV/{max(config.block_size, 4)}{sharing}"
    if config.kv_layout == "contiguous":
        return "contiguous KV"
    return f"paged KV/{config.block_size}" + (" + prefix cache" if config.prefix_caching else "")


def config_summary(config: EngineConfig, info: EngineInfo | None = None) -> str:
    """The configuration in one line: backend, precision, attention, KV cache, batching and the rest.

    `info` (the loaded engine's) replaces `auto` choices by what they resolved to.
    """
    backend = info.backend if info else config.backend
    parts = [model_label(config.model), f"{backend} backend" if backend != "hf" else "hf backend (transformers)",
             info.dtype if info else config.dtype]
    if config.quantization != "none":
        parts.append(config.quantization)
    attention = info.attention if info else config.attention
    parts.append(f"attention {attention}")
    parts.append(_kv_summary(config, backend))
    if config.kv_cache_dtype != "auto":
        parts.append(f"KV {config.kv_cache_dtype}")
    if config.kv_cache_bytes and not (backend == "hf" and config.batching == "static"):
        parts.append(f"KV budget {format_bytes(config.kv_cache_bytes)}")
    batching = config.batching
    if backend == "hf":
        batching = "generate_batch continuous" if batching == "continuous" else "generate static"
    parts.append(f"{batching} ×{config.max_num_seqs}")
    context = info.max_model_len if info else config.max_model_len
    if context:
        parts.append(f"context {context}")
    if config.speculative != "off":
        source = config.draft_model if config.speculative == "draft" else "n-gram"
        parts.append(f"spec {source} k={config.num_speculative_tokens}")
    if config.gqa != "native":
        parts.append(f"GQA {config.gqa}")
    if config.tensor_parallel_size > 1:
        parts.append(f"TP {config.tensor_parallel_size}")
    return " · ".join(str(p) for p in parts)


def config_tag(config: EngineConfig, info: EngineInfo | None = None) -> str:
    """A short label of what shapes latency (backend, KV cache, batching), for chart rows and chat exports."""
    backend = info.backend if info else config.backend
    if backend == "hf":
        batching = "generate_batch" if config.batching == "continuous" else "generate static"
        return f"{model_label(config.model)} · hf · {batching} ×{config.max_num_seqs}"
    kv = "contiguous" if config.kv_layout == "contiguous" else (
        f"paged/{config.block_size}" + ("+prefix" if config.prefix_caching else ""))
    if config.kv_cache_dtype != "auto":
        kv += f" {config.kv_cache_dtype}"
    parts = [model_label(config.model), backend, kv, f"{config.batching} ×{config.max_num_seqs}"]
    if config.speculative != "off":
        parts.append(f"spec {config.speculative} k={config.num_speculative_tokens}")
    return " · ".join(parts)


def header_html(device: str, config: EngineConfig, info: EngineInfo | None, load_seconds: float | None) -> str:
    """The one-line header: device on the left, the active configuration on the right (with what `auto`
    resolved to once its engine is loaded)."""
    active = html.escape(config_summary(config, info))
    if info:
        active += f' <span class="hdr-muted">· {info.num_params / 1e6:.1f}M params</span>'
    if load_seconds is not None:
        active += f' <span class="hdr-muted">· loaded {load_seconds:.1f} s</span>'
    elif info is None:
        active += ' <span class="hdr-muted">· not loaded yet</span>'
    return (f'<div class="hdr"><span class="hdr-title">Inference Playground</span>'
            f'<span class="hdr-device">{html.escape(device)}</span>'
            f'<span class="hdr-config">{active}</span></div>')


def check_html(kind: str, text: str, plan: str = "") -> str:
    """A configuration's check line, "ok" or "bad"; `text` is trusted HTML, `plan` plain text shown under it."""
    mark = {"ok": "✓", "bad": "✕"}[kind]
    below = f'<div class="check-plan">{html.escape(plan)}</div>' if plan else ""
    return f'<div class="check {kind}">{mark} {text}{below}</div>'
