"""Where a model comes from, and whether loading it needs the network, known before anything loads.

Why: the model list marks which models are bundled, which are hub models already in the local
Hugging Face cache, and which Apply would download first; the check line says so before Apply, and
the load's progress counts the bytes that have arrived. Where a model comes from is the engine's
answer (`engine.hub_repo`); what the local cache holds is read from the cache itself.
"""

from __future__ import annotations

from pathlib import Path

from engine import hub_repo


def hub_cache_state(repo: str) -> str:
    """"cached" (config and weights in the local HF cache), "partial" (config only) or "missing"."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(repo, "config.json")
    if not isinstance(config, str):
        return "missing"
    snapshot = Path(config).parent
    has_weights = any(snapshot.glob("*.safetensors"))
    return "cached" if has_weights else "partial"


def hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_cache_bytes(repo: str) -> int:
    """Bytes of `repo` in the local HF cache so far (finished and in-progress downloads)."""
    from huggingface_hub import constants

    blobs = Path(constants.HF_HUB_CACHE) / ("models--" + repo.replace("/", "--")) / "blobs"
    if not blobs.is_dir():
        return 0
    return sum(path.stat().st_size for path in blobs.iterdir() if path.is_file())


def needs_download(model: str) -> bool:
    """Whether loading `model` (a curated name, a local folder or a hub id) fetches files from the hub first."""
    repo = hub_repo(model)
    return repo is not None and hub_cache_state(repo) != "cached"


def availability_note(model: str) -> str:
    """Where a model comes from and whether loading it needs the network."""
    repo = hub_repo(model)
    if repo is None:
        return "local files (no network needed)"
    state = hub_cache_state(repo)
    if state == "cached":
        return "hub model, in the local cache (no network needed)"
    if hub_offline():
        return "hub model, not in the local cache, and this server is offline (HF_HUB_OFFLINE): it cannot load"
    return "hub model, not in the local cache: Apply downloads it first (needs the network)"
