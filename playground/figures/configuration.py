"""A configuration in words: its label (every field that differs from the defaults), the header's longer
line (the label, then how it runs), and the check line that says whether it can run and what it would load.

Why one place: the header, the engine pool's list, Compare's columns, the benchmark's runs and exports and
the chat's TTFT rows and export all name configurations, and they must name the same one the same way:
all of them start from `config_tag`, so a toggle never drops out of one of them.
"""

from __future__ import annotations

import dataclasses
import html
from pathlib import Path

from engine import EngineConfig, EngineInfo
from playground.figures.units import format_bytes


def model_label(model: str) -> str:
    """A model as people name it: a curated name or hub id as is, a local folder by its name."""
    return Path(model).name if model.startswith(("/", ".", "~")) else model


def _spec_word(value: str, config: EngineConfig) -> str:
    return f"spec {value} k={config.num_speculative_tokens}"


def _k_word(value: int, config: EngineConfig) -> str | None:
    return None if config.speculative != "off" else f"spec k={value}"  # with speculation on, its word says k


# One compact word per `EngineConfig` field, shown when the field differs from its default. Every field
# has one (tests/playground/units/test_configuration_labels.py checks it), so two configurations that
# differ never share a label.
_WORDS = {
    "backend": lambda value, _: value,
    "device": lambda value, _: value,
    "dtype": lambda value, _: value,
    "quantization": lambda value, _: value,
    "gguf_type": lambda value, _: f"GGUF {value}",
    "attention": lambda value, _: f"attention {value}",
    "kv_layout": lambda value, _: f"{value} KV",
    "block_size": lambda value, _: f"block {value}",
    "prefix_caching": lambda value, _: "prefix cache" if value else "no prefix cache",
    "kv_cache_bytes": lambda value, _: f"KV budget {format_bytes(value)}",
    "kv_memory_fraction": lambda value, _: f"KV fraction {value:g}",
    "kv_cache_dtype": lambda value, _: f"KV {value}",
    "batching": lambda value, _: value,
    "max_num_seqs": lambda value, _: f"×{value} seqs",
    "max_num_batched_tokens": lambda value, _: f"{value} tok/step",
    "max_model_len": lambda value, _: f"context {value}",
    "speculative": _spec_word,
    "draft_model": lambda value, _: f"draft {model_label(value)}",
    "num_speculative_tokens": _k_word,
    "gqa": lambda value, _: f"GQA {value}",
    "tensor_parallel_size": lambda value, _: f"TP {value}",
    "pipeline_parallel_size": lambda value, _: f"PP {value}",
    "pipeline_micro_batches": lambda value, _: f"{value} micro-batches",
    "pipeline_schedule": lambda value, _: f"pipeline {value}",
    "disaggregation": lambda value, _: "disaggregated P/D",
    "seed": lambda value, _: f"seed {value}",
    "cuda_graphs": lambda value, _: "CUDA graphs" if value else "no CUDA graphs",
    "cpu_kernels": lambda value, _: "CPU kernels" if value else "no CPU kernels",
    "remote_url": lambda value, _: f"at {value.split('://', 1)[-1]}",
    "remote_model": lambda value, _: f"as {value}",
    "remote_api_key_env": lambda value, _: f"key ${value}",
}


def config_tag(config: EngineConfig) -> str:
    """The label of a configuration, for every chart row, legend, table header, export and pool entry.

    The model, then a compact word for each field that differs from `EngineConfig`'s default ("int8",
    "KV int8", "GQA 4", "TP 2", "spec ngram k=4"), or "defaults". A pure function of the configuration,
    so it also keys figures gathered per configuration (running medians).
    """
    words = []
    for field in dataclasses.fields(EngineConfig):
        value = getattr(config, field.name)
        if field.name != "model" and value != field.default:
            word = _WORDS[field.name](value, config)
            if word:
                words.append(word)
    return " · ".join([model_label(config.model), *(words or ["defaults"])])


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
    """The label, then how the configuration runs: backend, precision, attention, KV cache, batching, context.

    For the header and check lines, where there is room to say what `auto` choices resolved to (`info`,
    the loaded engine's) and what the defaults are.
    """
    backend = info.backend if info else config.backend
    if backend == "remote":
        return (f"{config_tag(config)} — an OpenAI-compatible server, figures measured at this client · prompts "
                f"encoded with {model_label(config.model)}'s tokenizer")
    batching = config.batching
    if backend == "hf":
        batching = "generate_batch continuous" if batching == "continuous" else "generate static"
    parts = [f"{backend} backend" if backend != "hf" else "hf backend (transformers)",
             info.dtype if info else config.dtype, f"attention {info.attention if info else config.attention}",
             _kv_summary(config, backend), f"{batching} ×{config.max_num_seqs}"]
    context = info.max_model_len if info else config.max_model_len
    if context:
        parts.append(f"context {context}")
    return f"{config_tag(config)} — {' · '.join(str(p) for p in parts)}"


def header_html(device: str, config: EngineConfig, info: EngineInfo | None, load_seconds: float | None,
                startup: str | None = None) -> str:
    """The one-line header: device on the left, the active configuration on the right (with what `auto`
    resolved to once its engine is loaded); under them the server's start-up self-check (`startup`), once it ran."""
    active = html.escape(config_summary(config, info))
    if info and info.num_params:  # a served model's parameters are the server's, unknown here
        active += f' <span class="hdr-muted">· {info.num_params / 1e6:.1f}M params</span>'
    if load_seconds is not None:
        active += f' <span class="hdr-muted">· loaded {load_seconds:.1f} s</span>'
    elif info is None:
        active += ' <span class="hdr-muted">· not loaded yet</span>'
    check = f'<span class="hdr-check">{html.escape(startup)}</span>' if startup else ""
    return (f'<div class="hdr"><span class="hdr-title">Inference Playground</span>'
            f'<span class="hdr-device">{html.escape(device)}</span>'
            f'<span class="hdr-config">{active}</span>{check}</div>')


def check_html(kind: str, text: str, plan: str = "") -> str:
    """A configuration's check line, "ok" or "bad"; `text` is trusted HTML, `plan` plain text shown under it."""
    mark = {"ok": "✓", "bad": "✕"}[kind]
    below = f'<div class="check-plan">{html.escape(plan)}</div>' if plan else ""
    return f'<div class="check {kind}">{mark} {text}{below}</div>'
