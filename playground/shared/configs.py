"""Configurations the playground builds by name: a model at the engine's defaults, and a preset as written.

Why a module: the engine panel (presets), Compare (a side that starts from a preset, the transformers
baseline) and the OpenAI routes (`model@preset`) all build configurations the same way, so a preset
means the same thing wherever it is named. Both return plain fields, validated later as one
`EngineConfig` under the hosting limits (`PlaygroundContext.validate`).
"""

from __future__ import annotations

import dataclasses

from engine import EngineConfig, load_preset
from playground.shared.errors import Refused
from playground.shared.values import shown


def default_config(model: str) -> dict:
    """EngineConfig's defaults for `model` (not validated: the model may be anything)."""
    return {**EngineConfig().to_dict(), "model": model}


def preset_config(name: str, model: str, presets: list[str]) -> dict:
    """A preset applied as written: the defaults, the preset's fields, and the current model.

    A preset names optimizations, not a model, so the model stays; every field the preset does not
    name returns to its default. Only the names in presets/ may be asked for (no paths).
    """
    if not isinstance(name, str) or name not in presets:
        raise Refused(f"no preset {shown(name)}; available presets: {', '.join(presets)}")
    known = {field.name for field in dataclasses.fields(EngineConfig)}
    preset = load_preset(name)
    unknown = sorted(set(preset) - known)
    if unknown:
        raise Refused(f"preset {name!r} names unknown field(s): {', '.join(unknown)}")
    return {**default_config(model), **preset, "model": model}
