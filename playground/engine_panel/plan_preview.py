"""What Apply would load, in one line: the engine's own plan of a configuration, for the panel's check line.

Why: a configuration that validates can still be one its checkpoint refuses (a context longer than the
model's, heads that do not split over the ranks), and its `auto` choices resolve only against the
checkpoint and this host. `engine.plan_engine` makes every such choice without loading weights, so the
line says what Apply would load (backend, device, dtype, attention, context, KV blocks) before it does.
The check runs on every change of a control, so each configuration's summary is kept (the newest few
dozen); a check never downloads: a hub model that is not in the local cache is named as what Apply
downloads first.
"""

from __future__ import annotations

import functools

from engine import EngineConfig, ModelLoadError, hub_repo, plan_engine
from playground.engine_panel.availability import hub_offline, needs_download

KEPT_PLANS = 48


@functools.lru_cache(maxsize=KEPT_PLANS)
def plan_summary(config: EngineConfig) -> str:
    """`engine.plan_engine(config, download=False).summary()`, once per configuration."""
    return plan_engine(config, download=False).summary()


def apply_preview(config: EngineConfig) -> str:
    """What Apply would load, or which hub models it would download first; raises the engine's ConfigError /
    ModelLoadError for a configuration that its checkpoint or this host refuses."""
    try:
        return plan_summary(config)
    except ModelLoadError:
        missing = [name for name in (config.model, config.draft_model) if name and needs_download(name)]
        if not missing or hub_offline():
            raise
        repos = ", ".join(hub_repo(name) for name in missing)
        return f"will be downloaded on Apply: {repos} (not in the local cache yet)"
