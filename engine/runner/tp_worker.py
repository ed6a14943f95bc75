"""One tensor-parallel worker process: a shard of the model and of the KV pool, running the steps rank 0 broadcasts.

`TensorParallelExecutor` starts N of these with torch.multiprocessing (spawn). Rank 0 takes each
command (a `StepPlan`, or stop) from the engine over a pipe and broadcasts it to the other ranks
with `torch.distributed.broadcast_object_list`, so all ranks run the same step in lockstep; rank 0
sends the logits back. Commands travel on the default (gloo) group, whose long timeout lets idle
ranks wait for work; the model's all-reduce / all-gather run on a second group (gloo on a CPU,
NCCL on GPUs) whose short timeout turns a peer that stopped answering into an error.

A heartbeat thread sends this rank's counters to the engine twice a second and ends the process
as soon as the engine's process is gone (the parent id changes or the pipe breaks), so workers
never outlive an engine that was killed. Any exception is fatal: the rank reports it and exits;
its peers' collectives then fail, and the engine tears everything down.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from engine.core.metrics import peak_memory_bytes
from engine.core.threads import EXIT_SIGNALS
from engine.model.parallel import CollectiveTimer, ParallelContext
from engine.quant.storage import weight_storage_bytes
from engine.runner.build import RunnerSettings, build_runner

LOOPBACK = "127.0.0.1"
HEARTBEAT_INTERVAL = 0.5
RENDEZVOUS_TIMEOUT = timedelta(seconds=120)
IDLE_TIMEOUT = timedelta(days=365)          # a rank may wait this long for the next command
COLLECTIVE_TIMEOUT = timedelta(seconds=60)  # ranks run in lockstep: a longer wait inside a step means a stuck peer
STEP, STOP = "step", "stop"


@dataclass(frozen=True)
class WorkerSpec:
    """Who this worker is and where to meet its peers."""

    rank: int
    size: int
    store_port: int
    threads: int
    parent_pid: int
    settings: RunnerSettings


class StatusChannel:
    """This rank's one-way pipe to the engine, shared by the main and heartbeat threads."""

    def __init__(self, connection):
        self.connection = connection
        self.lock = threading.Lock()

    def send(self, message) -> None:
        """Send, or end the process: a broken pipe means the engine is gone."""
        try:
            with self.lock:
                self.connection.send(message)
        except OSError:
            os._exit(1)


def _heartbeat(channel: StatusChannel, parent_pid: int, counters: dict) -> None:
    while True:
        time.sleep(HEARTBEAT_INTERVAL)
        if os.getppid() != parent_pid:
            os._exit(1)
        channel.send(("beat", dict(counters)))


class Worker:
    """Joins the process groups, builds this rank's runner, then executes broadcast plans until told to stop."""

    def __init__(self, spec: WorkerSpec, command, counters: dict):
        self.rank = spec.rank
        self.command = command
        self.counters = counters
        self.cuda = spec.settings.device == "cuda"
        torch.set_num_threads(spec.threads)
        if self.cuda:
            torch.cuda.set_device(spec.rank)
        store = dist.TCPStore(LOOPBACK, spec.store_port, is_master=False, timeout=RENDEZVOUS_TIMEOUT)
        dist.init_process_group("gloo", store=store, rank=spec.rank, world_size=spec.size, timeout=IDLE_TIMEOUT)
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
        dist.destroy_process_group()


def run_worker(spec: WorkerSpec, command, status) -> None:
    """The worker process's entry point (spawned; `command` is None except on rank 0)."""
    # A spawned process inherits the signal mask of the thread that started it, which may be an engine helper
    # thread's (SIGINT and SIGTERM blocked): a SIGTERM must reach this process.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, EXIT_SIGNALS)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the engine's to handle; it then stops us
    channel = StatusChannel(status)
    counters = {"execute_seconds": 0.0, "collective_seconds": 0.0, "steps": 0, "peak_memory_bytes": 0}
    threading.Thread(target=_heartbeat, args=(channel, spec.parent_pid, counters), name="tp-heartbeat",
                     daemon=True).start()
    try:
        worker = Worker(spec, command, counters)
        channel.send(("ready", worker.describe()))
        worker.serve()
    except BaseException as error:
        failed_at = time.monotonic()
        traceback.print_exc()
        # The time lets the engine tell a first failure from peers failing after it (CLOCK_MONOTONIC is system-wide).
        channel.send(("error", (failed_at, f"{type(error).__name__}: {error}")))
        os._exit(1)
    # The process groups are destroyed and nothing is left to flush but stdio; the interpreter's own teardown
    # of torch.distributed would take seconds more.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
