"""Loading an engine while the page shows where it is: phases, a progress bar, bytes downloaded.

Why: a load can take from a second (the bundled demo) to minutes (a hub model downloaded first),
and "Loading…" alone does not say whether anything is happening. A `LoadJob` runs the pool's
lease in a background thread and records the phase the pool reports ("waiting", "sizing",
"loading"); the handler polls it and renders `progress_html`. Whether a model comes from the hub,
and whether it is already in the local Hugging Face cache, is known before loading, so the model
list can say which models need the network.
"""

from __future__ import annotations

import html
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from engine import EngineInfo, EngineStats
from playground.pool import EnginePool

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def hub_repo(model: str, models: dict) -> str | None:
    """The hub repository `model` is fetched from, or None for a bundled model or a local folder."""
    entry = models.get(model)
    source = entry.source if entry is not None else model
    if not isinstance(source, str) or not _HUB_ID.match(source):
        return None
    local = Path(source) if Path(source).is_absolute() else PROJECT_ROOT / source
    if local.is_dir() or Path(source).is_dir():
        return None
    return source


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


def availability_note(model: str, models: dict) -> str:
    """Where a model comes from and whether loading it needs the network."""
    repo = hub_repo(model, models)
    if repo is None:
        return "local files (no network needed)"
    state = hub_cache_state(repo)
    if state == "cached":
        return "hub model, in the local cache (no network needed)"
    if hub_offline():
        return "hub model, not in the local cache, and this server is offline (HF_HUB_OFFLINE): it cannot load"
    return "hub model, not in the local cache: Apply downloads it first (needs the network)"


@dataclass
class LoadOutcome:
    """What a finished load reports to the page."""

    info: EngineInfo
    stats: EngineStats
    load_seconds: float
    config: dict  # the loaded engine's resolved configuration


class LoadJob:
    """One lease of `config` from the pool, taken in a background thread so the page can show its phases."""

    PHASES = ("checked", "sizing", "loading", "ready")

    def __init__(self, pool: EnginePool, config: dict, repo: str | None):
        self.config = config
        self.repo = repo
        self.phase = "queued"
        self.started = time.perf_counter()
        self.phase_started = self.started
        self.outcome: LoadOutcome | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._pool = pool
        self._thread = threading.Thread(target=self._run, name="playground-load", daemon=True)
        self._thread.start()

    def _set_phase(self, phase: str) -> None:
        self.phase, self.phase_started = phase, time.perf_counter()

    def _run(self) -> None:
        try:
            with self._pool.lease(self.config, on_phase=self._set_phase) as entry:
                engine = entry.engine
                self.outcome = LoadOutcome(engine.info, engine.stats(), entry.load_seconds,
                                           engine.config.to_dict())
        except BaseException as error:  # reported to the page; the pool already cleaned up
            self.error = error
        finally:
            self._set_phase("ready")
            self.done.set()

    def wait(self, timeout: float) -> bool:
        return self.done.wait(timeout)


def progress_html(job: LoadJob) -> str:
    """The load's phases as steps and one bar: done phases filled, the current one animated."""
    now = time.perf_counter()
    sizing_label = "download from the hub, then size" if job.repo else "size memory"
    steps = [("checked", "check"), ("sizing", sizing_label), ("loading", "load weights + warm up"), ("ready", "ready")]
    current = {"queued": 0, "waiting": 2, "checked": 0, "sizing": 1, "loading": 2, "ready": 3}.get(job.phase, 0)
    items = []
    for index, (_, label) in enumerate(steps):
        state = "done" if index < current else ("now" if index == current else "todo")
        items.append(f'<span class="step {state}">{index + 1}. {html.escape(label)}</span>')
    detail = f"{now - job.phase_started:.1f} s in this phase · {now - job.started:.1f} s in all"
    if job.phase == "waiting":
        detail = "another session is loading the same configuration: waiting for it · " + detail
    if job.phase == "sizing" and job.repo:
        detail += f" · {hub_cache_bytes(job.repo) / 2**20:,.1f} MiB of {job.repo} in the local cache"
    fraction = (current + 0.5) / len(steps)
    return (f'<div class="load-progress"><div class="steps">{"".join(items)}</div>'
            f'<div class="progress-track"><span class="progress-fill" style="width:{fraction * 100:.0f}%"></span>'
            f'</div><div class="progress-detail">{html.escape(detail)}</div></div>')
