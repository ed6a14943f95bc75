"""The engine's test seam: the few internals its own tests inspect or perturb, named in one place.

Why: a test that reaches through private attributes (`engine._backend.executor.runner...`) breaks with
every refactor and hides what it depends on. Tests take an `EngineProbe` instead; when the inside
of the engine moves, this module moves with it and the tests keep their words. Only tests import
it: the playground and the tools use the public API (`engine/__init__.py`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from torch import nn


class EngineProbe:
    """A window into one engine's native backend and loop thread (native backends only, but `on_loop`)."""

    def __init__(self, engine):
        self._engine = engine

    @property
    def _native(self):
        backend = self._engine._backend
        if backend is None or not hasattr(backend, "scheduler"):
            raise AssertionError("this probe needs a loaded engine on the native backend")
        return backend

    def on_loop(self, call: Callable[[object], object]):
        """Run `call(backend)` on the engine's loop thread between two steps and return its result."""
        return self._engine._on_loop(call)

    def loop_thread(self) -> threading.Thread | None:
        """The loop thread while one runs (None once an idle loop has ended)."""
        return self._engine._loop

    def model(self) -> nn.Module:
        """The target model, when it runs in this process (no tensor parallelism)."""
        return self._native.executor.runner.model

    def kv_storage(self) -> torch.Tensor:
        """The target's KV pool (every layer's K and V), when it lives in this process."""
        return self._native.executor.runner.kv_cache.storage

    def scheduler(self):
        return self._native.scheduler

    def decode_steps(self, since: float = 0.0) -> list:
        """The section timings of the decode steps finished after `since` (CPU, one process)."""
        return self._native.profiler.decode_steps(since)

    def rank_processes(self) -> list:
        """The executor's worker processes (`multiprocessing` processes), in the gang's order (rank 0 first)."""
        return [member.process for member in self._native.executor.gang.members]

    def request_leftovers(self) -> dict[str, int]:
        """What an idle engine must hold for no request: block tables, and the speculator's kept proposal
        distributions and draft positions (each should be 0 once every request has ended)."""
        backend = self._native
        speculator = backend.speculator
        return {"block tables": len(backend.block_manager.tables),
                "proposal distributions": len(speculator.proposal_probs) if speculator else 0,
                "draft positions written": len(getattr(speculator.proposer, "written", {})) if speculator else 0}

    def scoring_jobs(self) -> list:
        """The scoring jobs (perplexity, `next_token_log_probs`) the engine loop holds, oldest first."""
        return list(self._engine._scoring_jobs)
