"""Loading an engine in the background, so that the page can show where the load is.

Why: a load can take from a second (the bundled demo) to minutes (a hub model downloaded first),
and "Loading…" alone does not say whether anything is happening. A `LoadJob` runs the pool's
lease in a background thread and records the phase the pool reports ("waiting", "sizing",
"loading"); the handler polls it and draws the phases.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from engine import EngineConfig, EngineInfo, EngineStats
from playground.shared.pool import EnginePool


@dataclass
class LoadOutcome:
    """What a finished load reports to the page."""

    info: EngineInfo
    stats: EngineStats
    load_seconds: float
    config: EngineConfig  # the loaded engine's resolved configuration


class LoadJob:
    """One lease of `config` from the pool, taken in a background thread so the page can show its phases."""

    def __init__(self, pool: EnginePool, config: EngineConfig, repo: str | None):
        self.config = config
        self.repo = repo  # the hub repository the load fetches first, if any
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
                self.outcome = LoadOutcome(engine.info, engine.stats(), entry.load_seconds, engine.config)
        except BaseException as error:  # reported to the page; the pool already cleaned up
            self.error = error
        finally:
            self._set_phase("ready")
            self.done.set()

    def wait(self, timeout: float | None) -> bool:
        return self.done.wait(timeout)
