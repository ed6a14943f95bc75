"""The engine panel's values <-> an EngineConfig dict, parsed as strictly as any public input.

Why a module: the panel, the `/apply` API, presets and the live check all turn the same controls
into a configuration, and every one of them can be reached over HTTP with any JSON value. Parsing
here refuses anything that is not exactly what a control can produce (one clear `Refused` per bad
value, never a TypeError), then `EngineConfig` validates the combination and the hosting caps
bound every field that sizes memory.
"""

from __future__ import annotations

import dataclasses
import math

from engine import CHOICES, EngineConfig, load_preset
from playground.errors import Refused
from playground.settings import MAX_SEED, Settings

MIB = 1024 * 1024
MAX_NAME_CHARS = 300
# Every control of the engine panel, in the order the UI passes them to `apply` and `check`.
FORM_FIELDS = (
    "model", "custom_model", "backend", "device", "dtype", "quantization", "attention", "kv_layout",
    "block_size", "prefix_caching", "kv_cache_mib", "batching", "max_num_seqs", "max_num_batched_tokens",
    "max_model_len", "kv_memory_fraction", "speculative", "draft_model", "num_speculative_tokens", "gqa",
    "tensor_parallel_size", "seed", "cuda_graphs", "cpu_kernels",
)
# Config fields the panel shows under another name or derives (the rest share their control's name).
_DERIVED = {"model", "kv_cache_bytes", "max_model_len", "kv_memory_fraction", "draft_model"}
# Hosting caps (Settings attribute -> config field), enforced in public mode.
CAPPED_FIELDS = {"max_num_seqs": "PLAYGROUND_MAX_NUM_SEQS", "max_num_batched_tokens": "PLAYGROUND_MAX_BATCHED_TOKENS",
                 "max_model_len": "PLAYGROUND_MAX_MODEL_LEN"}


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _text(name: str, value, allow_empty: bool = True) -> str:
    if value is None and allow_empty:
        return ""
    if not isinstance(value, str):
        raise Refused(f"{name} must be text, got {_shown(value)}")
    value = value.strip()
    if len(value) > MAX_NAME_CHARS:
        raise Refused(f"{name} is longer than {MAX_NAME_CHARS} characters")
    if not value and not allow_empty:
        raise Refused(f"{name} must not be empty")
    return value


def _choice(name: str, value) -> str:
    choices = CHOICES[name]
    if not isinstance(value, str) or value not in choices:
        raise Refused(f"{name} must be one of {', '.join(choices)}; got {_shown(value)}")
    return value


def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise Refused(f"{name} must be a number, got {_shown(value)}")
    try:
        number = float(value)
    except ValueError:
        raise Refused(f"{name} must be a number, got {_shown(value)}") from None
    if not math.isfinite(number):
        raise Refused(f"{name} must be a finite number, got {_shown(value)}")
    return number


def parse_int(name: str, value, minimum: int, maximum: int | None = None) -> int:
    """An integer from a control (ints, integral floats, digit strings), inside [minimum, maximum]."""
    number = _number(name, value)
    if number != int(number):
        raise Refused(f"{name} must be a whole number, got {_shown(value)}")
    number = int(number)
    if number < minimum or (maximum is not None and number > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise Refused(f"{name} must be {bound}, got {number}")
    return number


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise Refused(f"{name} must be true or false, got {_shown(value)}")
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
    custom = _text("custom model", values["custom_model"])
    model = custom or _text("model", values["model"], allow_empty=False)
    speculative = _choice("speculative", values["speculative"])
    kv_mib = 0.0 if values["kv_cache_mib"] is None else _number("kv_cache_bytes (MiB)", values["kv_cache_mib"])
    if kv_mib < 0 or kv_mib > 2**30:
        raise Refused(f"kv_cache_bytes (MiB) must be 0 (automatic) or a positive size, got {_shown(kv_mib)}")
    max_model_len = 0 if values["max_model_len"] is None else parse_int("max_model_len", values["max_model_len"],
                                                                        0, 2**24)
    if max_model_len == 1:
        raise Refused("max_model_len must be 0 (the model's own) or at least 2")
    fraction = 0.0 if values["kv_memory_fraction"] is None else _number("kv_memory_fraction",
                                                                          values["kv_memory_fraction"])
    if not 0 <= fraction <= 1:
        raise Refused(f"kv_memory_fraction must be 0 (the device's default) or in (0, 1], got {_shown(fraction)}")
    draft = _text("draft_model", values["draft_model"]) if speculative == "draft" else ""
    return {
        **(extras or {}),
        "model": model,
        "backend": _choice("backend", values["backend"]),
        "device": _choice("device", values["device"]),
        "dtype": _choice("dtype", values["dtype"]),
        "quantization": _choice("quantization", values["quantization"]),
        "attention": _choice("attention", values["attention"]),
        "kv_layout": _choice("kv_layout", values["kv_layout"]),
        "block_size": parse_int("block_size", values["block_size"], 1, 1024),
        "prefix_caching": _flag("prefix_caching", values["prefix_caching"]),
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
        "seed": parse_int("seed", values["seed"], 0, MAX_SEED),
        "cuda_graphs": _flag("cuda_graphs", values["cuda_graphs"]),
        "cpu_kernels": _flag("cpu_kernels", values["cpu_kernels"]),
    }


def config_to_form(config: dict, curated: list[str]) -> dict:
    """The panel's values for a configuration (the inverse of `parse_form`)."""
    kv_bytes = config.get("kv_cache_bytes")
    in_list = config["model"] in curated
    form = {name: config[name] for name in FORM_FIELDS if name in config and name not in _DERIVED}
    form.update({
        "model": config["model"] if in_list else (curated[0] if curated else config["model"]),
        "custom_model": "" if in_list else config["model"],
        "kv_cache_mib": kv_bytes / MIB if kv_bytes else 0,
        "max_model_len": config.get("max_model_len") or 0,
        "kv_memory_fraction": config.get("kv_memory_fraction") or 0,
        "draft_model": config.get("draft_model") or "",
        "gqa": str(config["gqa"]),
    })
    return form


def extras_of(config: dict) -> dict:
    """Config fields the panel has no control for (presets may name fields added after the panel)."""
    controlled = set(FORM_FIELDS) | _DERIVED
    return {name: value for name, value in config.items() if name not in controlled}


def default_config(model: str) -> dict:
    """EngineConfig's defaults for `model` (not validated: the model may be anything)."""
    return {**EngineConfig().to_dict(), "model": model}


def preset_config(name: str, model: str, presets: list[str]) -> dict:
    """A preset applied as written: the defaults, the preset's fields, and the current model.

    A preset names optimizations, not a model, so the model stays; every field the preset does not
    name returns to its default. Only the names in presets/ may be asked for (no paths).
    """
    if not isinstance(name, str) or name not in presets:
        raise Refused(f"no preset {_shown(name)}; available presets: {', '.join(presets)}")
    known = {field.name for field in dataclasses.fields(EngineConfig)}
    preset = load_preset(name)
    unknown = sorted(set(preset) - known)
    if unknown:
        raise Refused(f"preset {name!r} names unknown field(s): {', '.join(unknown)}")
    return {**default_config(model), **preset, "model": model}


def enforce_caps(config: dict, settings: Settings, max_kv_cache_bytes: int | None) -> None:
    """Refuse a configuration whose memory-sizing fields exceed the hosting caps (public mode)."""
    for field_name, variable in CAPPED_FIELDS.items():
        cap, value = getattr(settings, field_name), config.get(field_name)
        if cap is not None and value is not None and value > cap:
            raise Refused(f"{field_name}={value} is over this server's cap of {cap} ({variable})")
    kv_bytes = config.get("kv_cache_bytes")
    if max_kv_cache_bytes is not None and kv_bytes is not None and kv_bytes > max_kv_cache_bytes:
        raise Refused(f"kv_cache_bytes={kv_bytes / MIB:,.0f} MiB is over this server's cap of "
                      f"{max_kv_cache_bytes / MIB:,.0f} MiB (PLAYGROUND_MAX_KV_CACHE_MIB)")
