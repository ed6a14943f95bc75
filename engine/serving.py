"""`open_engine`: the engine a configuration names, local (`Engine`) or served by another server (`ServedModel`).

Why one door: the playground's pool and the bench open engines by configuration; `backend='remote'` is a model that
an OpenAI-compatible server runs, which answers the same calls, so callers need not know which they hold.
"""

from __future__ import annotations

from engine.config import EngineConfig
from engine.engine import Engine
from engine.remote.policy import AddressPolicy
from engine.remote.served import ServedModel


def open_engine(config: EngineConfig, policy: AddressPolicy | None = None) -> Engine | ServedModel:
    """Load `config`'s engine; a served model's base URL is checked against `policy` (public hosting's allow-list)
    first, and on every request after."""
    if config.backend == "remote":
        return ServedModel(config, policy)
    return Engine(config)
