"""Executors: what the native backend calls to turn a `StepPlan` into logits, in one process or in N.

Why a seam here: the backend owns scheduling, blocks and sampling and should not care where the
model runs. `LocalExecutor` runs the model in the engine's own process; the tensor-parallel
executor (`tp_executor.py`) drives N worker processes that each hold a shard. Both report the
same figures, so `engine.stats()` has one shape whatever the size.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.pipeline_stats import PipelineStats
from engine.quant.storage import weight_storage_bytes
from engine.runner.build import RunnerSettings, build_runner
from engine.runner.model_runner import ModelRunner
from engine.runner.step_plan import StepPlan


@dataclass(frozen=True)
class ExecutorStats:
    """Memory each rank holds and where step time goes.

    `executor_seconds` is the engine's wall time inside `execute` (model steps, plus on N ranks
    the hand-over of plans and logits); `collective_seconds` is rank 0's time inside the model's
    all-reduce / all-gather calls, waiting for the other ranks included. `failure` says why the
    executor can no longer run steps (a worker died or hung), None while it can. With pipeline
    parallelism the per-rank lists have one entry per stage and `pipeline` holds the stages' figures.
    """

    rank_pids: list[int]
    rank_weights_bytes: list[int]
    rank_kv_cache_bytes: list[int]
    rank_threads: list[int]
    rank_collective_seconds: list[float]
    executor_seconds: float
    collective_seconds: float
    failure: str | None = None
    pipeline: PipelineStats | None = None

    @property
    def size(self) -> int:
        return len(self.rank_weights_bytes)

    @property
    def collective_share(self) -> float:
        return self.collective_seconds / self.executor_seconds if self.executor_seconds else 0.0


class Executor(Protocol):
    """Runs plans on the model, wherever it lives."""

    def execute(self, plan: StepPlan) -> torch.Tensor:
        """float32 logits [plan.num_logits, vocab], rows in plan order."""

    def stats(self) -> ExecutorStats:
        """Per-rank memory and time figures."""

    def close(self) -> None:
        """Free the model and KV pool, and end any process; idempotent."""


class LocalExecutor:
    """The whole model in the engine's own process."""

    def __init__(self, settings: RunnerSettings):
        self.runner: ModelRunner | None = build_runner(settings)
        self._weights_bytes = weight_storage_bytes(self.runner.model)
        self._kv_bytes = self.runner.kv_cache.nbytes
        self._seconds = 0.0

    def execute(self, plan: StepPlan) -> torch.Tensor:
        started = time.perf_counter()
        logits = self.runner.execute(plan)
        self._seconds += time.perf_counter() - started
        return logits

    def stats(self) -> ExecutorStats:
        return ExecutorStats([os.getpid()], [self._weights_bytes], [self._kv_bytes], [torch.get_num_threads()], [0.0],
                             self._seconds, 0.0)

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
            self.runner = None

