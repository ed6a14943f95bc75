"""The figures shown with each reply and in the header, computed and formatted one way.

Definitions follow DESIGN.md: the engine's TTFT runs from the request's arrival in the engine to
its first output token; decode throughput is (output tokens - 1) / (E2EL - TTFT), i.e. 1 / TPOT;
speculative acceptance = accepted / proposed. Two more waits are measured around the engine,
because a person waits longer than the engine's TTFT: `first_text_ms` runs from the server
receiving the message to its first text leaving the server (history fitting, tokenisation and
queueing included), and `visible_ttft_ms` from the browser's Enter to the first text on screen
(measured by the page; absent for API calls). Labels always say which one a number is.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from engine import EngineInfo

FIGURE_TITLES = {
    "engine TTFT": "time to first token inside the engine: from the request's arrival in the engine to its first "
                   "output token",
    "Enter → text": "what you waited: from pressing Enter to the first text on screen (network, queue, "
                    "tokenisation and the engine's TTFT)",
    "decode": "output tokens per second after the first one (1 / TPOT)",
    "prompt": "prompt tokens of this reply, and how many came from the prefix cache",
    "output": "tokens generated",
    "spec accept": "speculative tokens accepted / proposed for this reply, and the tokens it gained per verification "
                   "step (1 + accepted proposals per step; 1 = speculation gained nothing)",
    "context": "older turns left out so the prompt fits the model's context and the reply's token budget",
}


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


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def reply_figures(metrics: Any, speculative: bool) -> dict:
    """Per-reply figures from the engine's metrics, as plain numbers (also what the APIs return)."""
    figures = {
        "engine_ttft_ms": _ms(getattr(metrics, "ttft", None)),
        "decode_tokens_per_s": _round(decode_tokens_per_second(metrics), 1),
        "tpot_ms": _ms(getattr(metrics, "tpot", None)),
        "e2el_ms": _ms(getattr(metrics, "e2el", None)),
        "prompt_tokens": getattr(metrics, "prompt_tokens", 0) or 0,
        "cached_tokens": getattr(metrics, "cached_tokens", 0) or 0,
        "output_tokens": getattr(metrics, "output_tokens", 0) or 0,
    }
    if speculative:
        proposed = getattr(metrics, "spec_proposed", 0) or 0
        accepted = getattr(metrics, "spec_accepted", 0) or 0
        drafts = getattr(metrics, "spec_drafts", 0) or 0
        figures["spec_acceptance"] = round(accepted / proposed, 3) if proposed else None
        figures["spec_accepted"], figures["spec_proposed"] = accepted, proposed
        figures["spec_tokens_per_step"] = round(1 + accepted / drafts, 2) if drafts else None
    return figures


def figures_html(figures: dict, finish_reason: str | None = None, dropped_turns: int = 0, live: bool = False) -> str:
    """A row of small labelled chips placed under a reply (hover a chip for its definition)."""
    chips = [("engine TTFT", _fmt(figures.get("engine_ttft_ms"), "{:.0f} ms"))]
    if figures.get("visible_ttft_ms") is not None:
        chips.append(("Enter → text", _fmt(figures["visible_ttft_ms"], "{:.0f} ms")))
    chips += [
        ("decode", _fmt(figures.get("decode_tokens_per_s"), "{:.1f} tok/s")),
        ("prompt", f"{figures.get('prompt_tokens') or 0} tok · {figures.get('cached_tokens') or 0} cached"),
        ("output", f"{figures.get('output_tokens') or 0} tok"),
    ]
    if "spec_acceptance" in figures:
        chips.append(("spec accept", spec_acceptance_text(figures)))
    if dropped_turns:
        chips.append(("context", f"{dropped_turns} older turn{'s' if dropped_turns > 1 else ''} left out"))
    if finish_reason in ("length", "cancelled", "error"):
        chips.append(("finish", {"length": "token limit", "cancelled": "stopped"}.get(finish_reason, "error")))
    body = "".join(f'<span class="fig" title="{html.escape(FIGURE_TITLES.get(k, k))}">'
                   f'<span class="fig-k">{html.escape(k)}</span> <span class="fig-v">{html.escape(v)}</span></span>'
                   for k, v in chips)
    return f'<div class="msg-figures{" live" if live else ""}">{body}</div>'


def spec_acceptance_text(figures: dict) -> str:
    """A reply's acceptance: rate, accepted / proposed, tokens per verification step ("n/a" before any)."""
    if figures.get("spec_acceptance") is None:
        return "n/a"
    text = f"{figures['spec_acceptance']:.0%}"
    if figures.get("spec_proposed"):
        text += f" ({figures['spec_accepted']}/{figures['spec_proposed']})"
    if figures.get("spec_tokens_per_step") is not None:
        text += f" · {figures['spec_tokens_per_step']:.2f} tok/step"
    return text


def model_label(model: str) -> str:
    """A model as people name it: a curated name or hub id as is, a local folder by its name."""
    return Path(model).name if model.startswith(("/", ".", "~")) else model


def _kv_summary(config: dict, backend: str) -> str:
    """The KV cache as the backend that serves it really manages it."""
    if backend == "hf":
        if config["batching"] == "static":
            return "generate's own KV cache (per call)"
        sharing = " + block sharing" if config["prefix_caching"] else ""
        return f"transformers paged KV/{max(config['block_size'], 4)}{sharing}"
    if config["kv_layout"] == "contiguous":
        return "contiguous KV"
    return f"paged KV/{config['block_size']}" + (" + prefix cache" if config["prefix_caching"] else "")


def config_summary(config: dict, info: EngineInfo | None = None) -> str:
    """The configuration in one line: backend, precision, attention, KV cache, batching and the rest.

    `info` (the loaded engine's) replaces `auto` choices by what they resolved to.
    """
    backend = info.backend if info else config["backend"]
    parts = [model_label(config["model"]), f"{backend} backend" if backend != "hf" else "hf backend (transformers)",
             info.dtype if info else config["dtype"]]
    if config["quantization"] != "none":
        parts.append(config["quantization"])
    attention = info.attention if info else config["attention"]
    parts.append(f"attention {attention}")
    parts.append(_kv_summary(config, backend))
    if config.get("kv_cache_bytes") and not (backend == "hf" and config["batching"] == "static"):
        parts.append(f"KV budget {format_bytes(config['kv_cache_bytes'])}")
    batching = config["batching"]
    if backend == "hf":
        batching = "generate_batch continuous" if batching == "continuous" else "generate static"
    parts.append(f"{batching} ×{config['max_num_seqs']}")
    context = info.max_model_len if info else config["max_model_len"]
    if context:
        parts.append(f"context {context}")
    if config["speculative"] != "off":
        source = config["draft_model"] if config["speculative"] == "draft" else "n-gram"
        parts.append(f"spec {source} k={config['num_speculative_tokens']}")
    if config["gqa"] != "native":
        parts.append(f"GQA {config['gqa']}")
    if config["tensor_parallel_size"] > 1:
        parts.append(f"TP {config['tensor_parallel_size']}")
    return " · ".join(str(p) for p in parts)


def config_tag(config: dict, info: EngineInfo | None = None) -> str:
    """A short label of what shapes latency (backend, KV cache, batching), for chart rows and chat exports."""
    backend = info.backend if info else config["backend"]
    if backend == "hf":
        batching = "generate_batch" if config["batching"] == "continuous" else "generate static"
        return f"{model_label(config['model'])} · hf · {batching} ×{config['max_num_seqs']}"
    kv = "contiguous" if config["kv_layout"] == "contiguous" else (
        f"paged/{config['block_size']}" + ("+prefix" if config["prefix_caching"] else ""))
    parts = [model_label(config["model"]), backend, kv, f"{config['batching']} ×{config['max_num_seqs']}"]
    if config["speculative"] != "off":
        parts.append(f"spec {config['speculative']} k={config['num_speculative_tokens']}")
    return " · ".join(parts)


def header_html(device: str, config: dict | None, info: EngineInfo | None, load_seconds: float | None) -> str:
    """The one-line header: device on the left, active configuration on the right."""
    if config is None:
        active = '<span class="hdr-muted">no engine loaded</span>'
    else:
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


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else spec.format(value)
