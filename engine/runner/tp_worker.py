"""One tensor-parallel worker process: a shard of the model and of the KV pool, running the steps rank 0 broadcasts.

`TensorParallelExecutor` starts N of these (through a `WorkerGang`; heartbeats and fatal errors are
`worker_process.py`'s). Rank 0 takes each command (a `StepPlan`, or stop) from the engine over a
pipe and broadcasts it to the other ranks with `torch.distributed.broadcast_object_list`, so all
ranks run the same step in lockstep; rank 0 sends the logits back. Commands travel on the default
(gloo) group, whose long timeout lets idle ranks wait for work; the model's all-reduce /
all-gather run on a second group (gloo on a CPU, NCCL on GPUs) whose short timeout turns a peer
that stopped answering into an error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.core.metrics import peak_memory_bytes
from engine.model.parallel import CollectiveTimer, ParallelContext
from engine.quant.storage import weight_storage_bytes
from engine.runner.build import RunnerSettings, build_runner
from engine.runner.worker_process import COLLECTIVE_TIMEOUT, STOP, join_default_group, run_worker_process


@dataclass(frozen=True)
class WorkerSpec:
    """Who this worker is and where to meet its peers."""

    rank: int
    size: int
    store_port: int
    threads: int
    parent_pid: int
    settings: RunnerSettings


class TensorParallelWorker:
    """Joins the process groups, builds this rank's runner, then executes broadcast plans until told to stop."""

    def __init__(self, spec: WorkerSpec, command, counters: dict):
        self.rank = spec.rank
        self.command = command
        self.counters = counters
        counters.update(execute_seconds=0.0, collective_seconds=0.0, steps=0, peak_memory_bytes=0)
        self.cuda = spec.settings.device == "cuda"
        torch.set_num_threads(spec.threads)
        if self.cuda:
            torch.cuda.set_device(spec.rank)
        join_default_group(spec.store_port, spec.rank, spec.size)
        compute = dist.new_group(backend="nccl" if self.cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
        self.timer = CollectiveTimer(cuda=self.cuda)
        self.runner = build_runner(spec.settings, ParallelContext(spec.rank, spec.size, compute, self.timer))
        self.device = spec.settings.device

    def describe(self) -> dict:
        return {"weights_bytes": weight_storage_bytes(self.runner.model), "kv_cache_bytes": self.runner.kv_cache.nbytes,
                "threads": torch.get_num_threads()}

    def serve(self) -> None:
        while True:
            box = [self.command.recv() if self.rank == 0 else None]
            dist.broadcast_object_list(box, src=0)
            kind, plan = box[0]
            if kind == STOP:
                break
            started = time.perf_counter()
            logits = self.runner.execute(plan)
            if self.cuda:
                torch.cuda.synchronize()
            rows = logits.cpu().numpy() if self.rank == 0 else None
            self.counters.update(execute_seconds=self.counters["execute_seconds"] + time.perf_counter() - started,
                                 collective_seconds=self.timer.seconds, steps=self.counters["steps"] + 1,
                                 peak_memory_bytes=peak_memory_bytes(self.device))
            if self.rank == 0:
                self.command.send(("logits", rows, dict(self.counters)))


def run_worker(spec: WorkerSpec, command, status) -> None:
    """The worker process's entry point (spawned; `command` is None except on rank 0)."""
    run_worker_process(TensorParallelWorker, spec, command, status)
