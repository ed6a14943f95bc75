"""The engine panel's values <-> an engine configuration's fields, parsed as strictly as any public input.

Why a module: the panel, the `/apply` API, presets, the live check and Compare's "engine panel" side
all turn the same controls into a configuration, and every one of them can be reached over HTTP with
any JSON value. Parsing here refuses anything that is not exactly what a control can produce (one
clear `Refused` per bad value, never a TypeError); then `EngineConfig` validates the combination and
the hosting caps bound every field that sizes memory (`PlaygroundContext.validate`).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine import CHOICES
from playground.shared.errors import Refused
from playground.shared.settings import MAX_SEED, MIB
from playground.shared.values import parse_flag, parse_int, parse_number, parse_text, shown

# Every control of the engine panel, in the order the UI passes them to `apply` and `check`.
FORM_FIELDS = (
    "model", "custom_model", "backend", "device", "dtype", "quantization", "gguf_type", "attention", "kv_layout",
    "kv_cache_dtype", "block_size", "prefix_caching", "kv_cache_mib", "batching", "max_num_seqs",
    "max_num_batched_tokens", "max_model_len", "kv_memory_fraction", "speculative", "draft_model",
    "num_speculative_tokens", "gqa", "tensor_parallel_size", "pipeline_parallel_size", "pipeline_micro_batches",
    "pipeline_schedule", "disaggregation", "seed", "cuda_graphs", "cpu_kernels", "remote_url", "remote_model",
    "remote_api_key_env",
)
# Config fields the panel shows under another name or derives (the rest share their control's name).
_DERIVED = {"model", "kv_cache_bytes", "max_model_len", "kv_memory_fraction", "draft_model", "pipeline_micro_batches"}


def _choice(name: str, value) -> str:
    choices = CHOICES[name]
    if not isinstance(value, str) or value not in choices:
        raise Refused(f"{name} must be one of {', '.join(choices)}; got {shown(value)}")
    return value


def _gqa(value) -> str | int:
    if isinstance(value, str) and value in ("native", "mha"):
        return value
    return parse_int("gqa", value, 1, 1024)


def parse_form(values: dict, extras: dict | None = None) -> dict:
    """EngineConfig fields from the panel's values (not yet validated as a combination).

    Raises Refused naming the first control whose value no control could have produced.
    """
    if not isinstance(values, dict):
        raise Refused("the engine panel's values are missing")
    missing = [name for name in FORM_FIELDS if name not in values]
    if missing:
        raise Refused(f"missing value(s) for {', '.join(missing)}")
    custom = parse_text("custom model", values["custom_model"])
    model = custom or parse_text("model", values["model"], allow_empty=False)
    speculative = _choice("speculative", values["speculative"])
    kv_mib = 0.0 if values["kv_cache_mib"] is None else parse_number("kv_cache_bytes (MiB)", values["kv_cache_mib"])
    if kv_mib < 0 or kv_mib > 2**30:
        raise Refused(f"kv_cache_bytes (MiB) must be 0 (automatic) or a positive size, got {shown(kv_mib)}")
    max_model_len = 0 if values["max_model_len"] is None else parse_int("max_model_len", values["max_model_len"],
                                                                        0, 2**24)
    if max_model_len == 1:
        raise Refused("max_model_len must be 0 (the model's own) or at least 2")
    fraction = 0.0 if values["kv_memory_fraction"] is None else parse_number("kv_memory_fraction",
                                                                          values["kv_memory_fraction"])
    if not 0 <= fraction <= 1:
        raise Refused(f"kv_memory_fraction must be 0 (the device's default) or in (0, 1], got {shown(fraction)}")
    draft = parse_text("draft_model", values["draft_model"]) if speculative == "draft" else ""
    backend = _choice("backend", values["backend"])
    stages = parse_int("pipeline_parallel_size", values["pipeline_parallel_size"], 1, 1024)
    micro_batches = 0 if values["pipeline_micro_batches"] is None else parse_int(
        "pipeline_micro_batches", values["pipeline_micro_batches"], 0, 1024)
    return {
        **(extras or {}),
        "model": model,
        "backend": backend,
        "device": _choice("device", values["device"]),
        "dtype": _choice("dtype", values["dtype"]),
        "quantization": _choice("quantization", values["quantization"]),
        "gguf_type": _choice("gguf_type", values["gguf_type"]) if backend == "llama.cpp" else "f32",
        "attention": _choice("attention", values["attention"]),
        "kv_layout": _choice("kv_layout", values["kv_layout"]),
        "kv_cache_dtype": _choice("kv_cache_dtype", values["kv_cache_dtype"]),
        "block_size": parse_int("block_size", values["block_size"], 1, 1024),
        "prefix_caching": parse_flag("prefix_caching", values["prefix_caching"]),
        "kv_cache_bytes": int(kv_mib * MIB) if kv_mib > 0 else None,
        "batching": _choice("batching", values["batching"]),
        "max_num_seqs": parse_int("max_num_seqs", values["max_num_seqs"], 1, 2**20),
        "max_num_batched_tokens": parse_int("max_num_batched_tokens", values["max_num_batched_tokens"], 1, 2**24),
        "max_model_len": max_model_len or None,
        "kv_memory_fraction": fraction or None,
        "speculative": speculative,
        "draft_model": draft or None,
        "num_speculative_tokens": parse_int("num_speculative_tokens", values["num_speculative_tokens"], 1, 64),
        "gqa": _gqa(values["gqa"]),
        "tensor_parallel_size": parse_int("tensor_parallel_size", values["tensor_parallel_size"], 1, 1024),
        "pipeline_parallel_size": stages,
        "pipeline_micro_batches": micro_batches if stages > 1 and micro_batches else None,
        "pipeline_schedule": _choice("pipeline_schedule", values["pipeline_schedule"]),
        "disaggregation": _choice("disaggregation", values["disaggregation"]),
        "seed": parse_int("seed", values["seed"], 0, MAX_SEED),
        "cuda_graphs": parse_flag("cuda_graphs", values["cuda_graphs"]),
        "cpu_kernels": parse_flag("cpu_kernels", values["cpu_kernels"]),
        **_served_elsewhere(values, backend),
    }


def _served_elsewhere(values: dict, backend: str) -> dict:
    """The remote server's fields, read only with backend=remote (they keep their text while another backend is
    tried, as the draft model does while speculation is off)."""
    names = ("remote_url", "remote_model", "remote_api_key_env")
    return {name: parse_text(name, values[name]) if backend == "remote" else "" for name in names}


def read_form(values: Sequence, extras) -> dict:
    """Configuration fields from the panel's controls as the page sends them (in FORM_FIELDS order) and the
    preset fields the panel has no control for."""
    if not isinstance(values, list | tuple) or len(values) != len(FORM_FIELDS):
        got = f", got {len(values)}" if isinstance(values, list | tuple) else ""
        raise Refused(f"expected {len(FORM_FIELDS)} panel values{got}")
    return parse_form(dict(zip(FORM_FIELDS, values, strict=True)), extras if isinstance(extras, dict) else {})


def config_to_form(fields: dict, curated: list[str]) -> dict:
    """The panel's values for a configuration's fields (the inverse of `parse_form`)."""
    kv_bytes = fields["kv_cache_bytes"]
    in_list = fields["model"] in curated
    form = {name: fields[name] for name in FORM_FIELDS if name in fields and name not in _DERIVED}
    form.update({
        "model": fields["model"] if in_list else (curated[0] if curated else fields["model"]),
        "custom_model": "" if in_list else fields["model"],
        "kv_cache_mib": kv_bytes / MIB if kv_bytes else 0,
        "max_model_len": fields["max_model_len"] or 0,
        "kv_memory_fraction": fields["kv_memory_fraction"] or 0,
        "draft_model": fields["draft_model"] or "",
        "gqa": str(fields["gqa"]),
        "pipeline_micro_batches": fields["pipeline_micro_batches"] or 0,
    })
    return form


def extras_of(fields: dict) -> dict:
    """Configuration fields the panel has no control for (presets may name fields added after the panel)."""
    controlled = set(FORM_FIELDS) | _DERIVED
    return {name: value for name, value in fields.items() if name not in controlled}
