"""`TensorParallelExecutor`: N worker processes, each with a shard of the model and of the KV pool.

Design: every rank, rank 0 included, is a worker process (`tp_worker.py`), supervised by a
`WorkerGang` (start, heartbeats, failure with its root cause, shutdown); the engine's process only
schedules, hands rank 0 each plan over a pipe and samples from the logits rank 0 sends back
(vLLM's multiprocess executor does the same; nano-vllm instead runs rank 0 in the engine's own
process). The price is one extra hop per step for the plan and the logits. What it buys:
- the engine's process never sits inside a collective, so a dead or stuck rank can never hang
  it: it waits on pipes it can time out, reports a clear error and kills the workers;
- several engines (the playground's pool, the bench's `--compare`) can live in one process,
  since process groups exist only inside workers;
- all ranks run identical code.
"""

from __future__ import annotations

import threading
import time

import torch

from engine.runner.build import RunnerSettings
from engine.runner.executor import ExecutorStats
from engine.runner.step_plan import StepPlan
from engine.runner.tp_worker import WorkerSpec, run_worker
from engine.runner.worker_gang import WorkerGang
from engine.runner.worker_process import STEP


class TensorParallelExecutor:
    """Runs each plan on `size` worker processes and returns rank 0's logits."""

    def __init__(self, settings: RunnerSettings, size: int):
        self.size = size
        self._step_lock = threading.Lock()
        self._seconds = 0.0
        self._rank0_counters: dict = {}
        threads = max(1, torch.get_num_threads() // size)
        self.gang = WorkerGang(
            f"tensor_parallel_size={size}", [f"tensor-parallel rank {rank}" for rank in range(size)],
            lambda rank, port, parent: WorkerSpec(rank, size, port, threads, parent, settings), run_worker, {0})

    def execute(self, plan: StepPlan) -> torch.Tensor:
        """Rank 0's float32 logits for `plan`; raises WorkerFailure if any rank fails meanwhile."""
        with self._step_lock:
            started = time.perf_counter()
            self.gang.send(0, (STEP, plan))
            _, (_, rows, counters) = self.gang.receive([0])
            self._seconds += time.perf_counter() - started
            self._rank0_counters = counters
            return torch.from_numpy(rows)

    def stats(self) -> ExecutorStats:
        infos = self.gang.infos()
        beats = self.gang.counters()
        counters = [self._rank0_counters or beats[0]] + beats[1:]
        return ExecutorStats(
            rank_pids=self.gang.pids,
            rank_weights_bytes=[info.get("weights_bytes", 0) for info in infos],
            rank_kv_cache_bytes=[info.get("kv_cache_bytes", 0) for info in infos],
            rank_threads=[info.get("threads", 0) for info in infos],
            rank_collective_seconds=[c.get("collective_seconds", 0.0) for c in counters],
            executor_seconds=self._seconds, collective_seconds=counters[0].get("collective_seconds", 0.0),
            failure=self.gang.failure)

    def close(self) -> None:
        """Stop the workers (killing any that do not exit in time), then free pipes and the rendezvous port."""
        self.gang.close()
