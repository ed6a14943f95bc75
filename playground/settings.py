"""Limits for hosting the playground in public, read once from environment variables.

Defaults are safe for a public Hugging Face Space: when `SPACE_ID` is set (Spaces set it) and
`PLAYGROUND_ALLOWED_MODELS` is not, only the curated models of presets/models.toml may be loaded.
On a laptop, any local folder or hub id may be loaded. Remote code is never trusted, whatever
the settings: the engine only reads config.json, tokenizer files and safetensors weights.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ANY_MODEL = "*"
CURATED = "curated"


def _int_env(env: dict, name: str, default: int, minimum: int = 1) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from exc
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _float_env(env: dict, name: str, default: float | None) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be a number, got {raw!r}") from exc
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


@dataclass(frozen=True)
class Settings:
    """What a visitor may do: which models, how many tokens, how long a queue.

    `allowed_models` is None when any model may be loaded; otherwise a set of model names (the
    curated names and/or hub ids and paths). `curated_only` records that the set was derived from
    presets/models.toml, so the UI can hide the free model field.
    """

    allowed_models: frozenset[str] | None = None
    curated_only: bool = False
    max_new_tokens: int = 512
    max_prompt_tokens: int = 4096
    max_queue: int = 32
    max_concurrent_chats: int = 16
    pool_memory_gib: float | None = None
    max_engines: int = 3
    on_space: bool = False

    @classmethod
    def from_env(cls, curated_models: list[str], env: dict | None = None) -> Settings:
        """Read PLAYGROUND_* variables; `curated_models` are the names in presets/models.toml.

        PLAYGROUND_ALLOWED_MODELS: comma list of model names / hub ids / paths; `curated` stands
        for the curated list and `*` for anything. Unset: curated only on a Space, anything
        elsewhere.
        """
        env = dict(os.environ if env is None else env)
        on_space = bool(env.get("SPACE_ID"))
        raw = env.get("PLAYGROUND_ALLOWED_MODELS", "").strip()
        items = [item.strip() for item in raw.split(",") if item.strip()]
        if not items:
            items = [CURATED] if on_space else [ANY_MODEL]
        if ANY_MODEL in items:
            allowed, curated_only = None, False
        else:
            names = set()
            for item in items:
                names.update(curated_models if item == CURATED else [item])
            allowed = frozenset(names)
            curated_only = names <= set(curated_models)
        return cls(
            allowed_models=allowed,
            curated_only=curated_only,
            max_new_tokens=_int_env(env, "PLAYGROUND_MAX_NEW_TOKENS", 256 if on_space else 512),
            max_prompt_tokens=_int_env(env, "PLAYGROUND_MAX_PROMPT_TOKENS", 2048 if on_space else 4096),
            max_queue=_int_env(env, "PLAYGROUND_MAX_QUEUE", 32 if on_space else 64),
            max_concurrent_chats=_int_env(env, "PLAYGROUND_MAX_CONCURRENT_CHATS", 16),
            pool_memory_gib=_float_env(env, "PLAYGROUND_POOL_MEMORY_GIB", None),
            max_engines=_int_env(env, "PLAYGROUND_MAX_ENGINES", 2 if on_space else 3),
            on_space=on_space,
        )

    def model_refusal(self, model: str) -> str | None:
        """Why `model` may not be loaded here, or None if it may."""
        if self.allowed_models is None or model in self.allowed_models:
            return None
        allowed = ", ".join(sorted(self.allowed_models))
        return (f"model {model!r} is not allowed on this server (PLAYGROUND_ALLOWED_MODELS); "
                f"allowed: {allowed}")
