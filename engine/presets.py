"""The `presets/` folder: optimization presets (TOML files of `EngineConfig` fields) and the curated model list.

Why a module of its own: the configuration, the model resolver (`hub`) and the tools all read this
folder, and none of them should have to import another just to find it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from engine.errors import ConfigError

PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"
MODELS_FILE = "models.toml"


def list_presets() -> list[str]:
    """Names of the optimization presets in presets/ (models.toml is the model list, not a preset)."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml") if p.name != MODELS_FILE)


def load_preset(name_or_path: str) -> dict:
    """Read a preset TOML (by name in presets/ or by path) into a dict of EngineConfig fields."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESETS_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise ConfigError(f"no preset {name_or_path!r}; available presets: {', '.join(list_presets())}")
    with path.open("rb") as handle:
        data = tomllib.load(handle)
    data.pop("description", None)
    return data


def preset_description(name: str) -> str:
    path = PRESETS_DIR / f"{name}.toml"
    with path.open("rb") as handle:
        return tomllib.load(handle).get("description", "")
