"""EngineConfig fields written as text, `KEY=VALUE`: how `python -m engine.bench --set` and the playground's
Compare tab take changes to a configuration.

Why one parser: a person who writes `quantization=int8` or `kv_cache_bytes=64MiB` in the playground must
get exactly what the same text gives the bench on the command line. Values are read loosely here (the
field's choices as written, none, booleans, numbers, sizes); `EngineConfig` then refuses anything that is
not a valid value for its field.
"""

from __future__ import annotations

import re

from engine.config import CHOICES
from engine.errors import ConfigError

_SIZE = re.compile(r"^(\d+)\s*(KiB|MiB|GiB|KB|MB|GB)$", re.IGNORECASE)
_SIZE_UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_value(text: str):
    """A value: None, a bool, an int (sizes like 64MiB allowed), a float, or the string itself."""
    lowered = text.strip().lower()
    if lowered in ("none", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    size = _SIZE.match(text.strip())
    if size:
        return int(size.group(1)) * _SIZE_UNITS[size.group(2).lower()]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_setting(key: str, text: str):
    """A value for field `key`: one of the field's choices as written (quantization=none), else parsed."""
    if text.strip() in CHOICES.get(key, ()):
        return text.strip()
    return parse_value(text)


def parse_sets(items: list[str]) -> dict:
    """`KEY=VALUE` items -> {field: value}; an item without `=` raises ConfigError."""
    values = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"a setting is written key=value, got {item!r}")
        key, value = item.split("=", 1)
        values[key.strip()] = parse_setting(key.strip(), value)
    return values
