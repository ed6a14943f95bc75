"""The figures shown with each reply and in the header, computed and formatted one way.

Definitions follow DESIGN.md: TTFT from arrival to the first output token; decode throughput is
(output tokens - 1) / (E2EL - TTFT), i.e. 1 / TPOT; speculative acceptance = accepted / proposed.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any


def format_bytes(num_bytes: float | None) -> str:
    if num_bytes is None:
        return "n/a"
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def decode_tokens_per_second(metrics: Any) -> float | None:
    """Tokens per second after the first one, None until two tokens are out."""
    output_tokens = getattr(metrics, "output_tokens", 0) or 0
    ttft, e2el = getattr(metrics, "ttft", None), getattr(metrics, "e2el", None)
    if output_tokens < 2 or ttft is None or e2el is None or e2el <= ttft:
        return None
    return (output_tokens - 1) / (e2el - ttft)


def reply_figures(metrics: Any, speculative: bool) -> dict:
    """Per-reply figures as plain numbers (also what the API returns)."""
    ttft = getattr(metrics, "ttft", None)
    figures = {
        "ttft_ms": None if ttft is None else round(ttft * 1000, 1),
        "decode_tokens_per_s": _round(decode_tokens_per_second(metrics), 1),
        "prompt_tokens": getattr(metrics, "prompt_tokens", 0) or 0,
        "output_tokens": getattr(metrics, "output_tokens", 0) or 0,
        "cached_tokens": getattr(metrics, "cached_tokens", 0) or 0,
    }
    if speculative:
        proposed = getattr(metrics, "spec_proposed", 0) or 0
        accepted = getattr(metrics, "spec_accepted", 0) or 0
        figures["spec_acceptance"] = round(accepted / proposed, 3) if proposed else None
    return figures


def figures_html(figures: dict, finish_reason: str | None = None) -> str:
    """A row of small labelled chips placed under a reply."""
    chips = [
        ("TTFT", _fmt(figures.get("ttft_ms"), "{:.0f} ms")),
        ("decode", _fmt(figures.get("decode_tokens_per_s"), "{:.1f} tok/s")),
        ("prompt", f"{figures['prompt_tokens']} tok"),
        ("output", f"{figures['output_tokens']} tok"),
        ("cached", f"{figures['cached_tokens']} tok"),
    ]
    if "spec_acceptance" in figures:
        chips.append(("spec accept", _fmt(figures["spec_acceptance"], "{:.0%}")))
    if finish_reason in ("length", "cancelled", "error"):
        chips.append(("finish", {"length": "token limit", "cancelled": "stopped"}.get(finish_reason, "error")))
    body = "".join(f'<span class="fig"><span class="fig-k">{html.escape(k)}</span> '
                   f'<span class="fig-v">{html.escape(v)}</span></span>' for k, v in chips)
    return f'<div class="msg-figures">{body}</div>'


def model_label(model: str) -> str:
    """A model as people name it: a curated name or hub id as is, a local folder by its name."""
    return Path(model).name if model.startswith(("/", ".", "~")) else model


def config_summary(config: dict, info: dict | None = None) -> str:
    """The active configuration in one short line, e.g. for the header.

    `info` (the loaded engine's) replaces `auto` choices by what they resolved to.
    """
    info = info or {}
    parts = [model_label(config["model"]), info.get("backend") or config["backend"],
             info.get("dtype") or config["dtype"]]
    if config["quantization"] != "none":
        parts.append(config["quantization"])
    parts.append(info.get("attention") or f"attention {config['attention']}")
    kv = f"{config['kv_layout']} KV"
    if config["kv_layout"] == "paged":
        kv += f"/{config['block_size']}"
    if config["prefix_caching"]:
        kv += " + prefix"
    parts.append(kv)
    if config.get("kv_cache_bytes"):
        parts.append(f"KV budget {format_bytes(config['kv_cache_bytes'])}")
    parts.append(f"{config['batching']} ×{config['max_num_seqs']}")
    if config["speculative"] != "off":
        source = config["draft_model"] if config["speculative"] == "draft" else "n-gram"
        parts.append(f"spec {source} k={config['num_speculative_tokens']}")
    if config["gqa"] != "native":
        parts.append(f"GQA {config['gqa']}")
    if config["tensor_parallel_size"] > 1:
        parts.append(f"TP {config['tensor_parallel_size']}")
    return " · ".join(str(p) for p in parts)


def header_html(device: str, config: dict | None, info: dict | None, load_seconds: float | None) -> str:
    """The one-line header: device on the left, active configuration on the right."""
    if config is None:
        active = '<span class="hdr-muted">no engine loaded</span>'
    else:
        active = html.escape(config_summary(config, info))
        if info and info.get("num_params"):
            active += f' <span class="hdr-muted">· {info["num_params"] / 1e6:.1f}M params</span>'
        if load_seconds is not None:
            active += f' <span class="hdr-muted">· loaded {load_seconds:.1f} s</span>'
    return (f'<div class="hdr"><span class="hdr-title">Inference Playground</span>'
            f'<span class="hdr-device">{html.escape(device)}</span>'
            f'<span class="hdr-config">{active}</span></div>')


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else spec.format(value)
