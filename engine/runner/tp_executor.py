"""`TensorParallelExecutor`: N worker processes, each with a shard of the model and of the KV pool.

Design: every rank, rank 0 included, is a worker process (`tp_worker.py`); the engine's process
only schedules, hands rank 0 each plan over a pipe and samples from the logits rank 0 sends back
(vLLM's multiprocess executor does the same; nano-vllm instead runs rank 0 in the engine's own
process). The price is one extra hop per step for the plan and the logits. What it buys:
- the engine's process never sits inside a collective, so a dead or stuck rank can never hang
  it: it waits on pipes it can time out, reports a clear error and kills the workers;
- several engines (the playground's pool, the bench's `--compare`) can live in one process,
  since process groups exist only inside workers;
- all ranks run identical code.

The rendezvous store (a `TCPStore` on a free loopback port chosen by the OS) belongs to this
object, so its port goes with `close()`. A monitor thread reads each rank's heartbeats and
watches the processes: a rank that exits, reports an error, or misses heartbeats for
`HEARTBEAT_TIMEOUT` seconds fails the executor at once: every worker is killed, and the step
being waited for (and any later one) raises `WorkerFailure`. The failure names the root cause:
when one rank dies its peers fail in their next collective ("Connection reset by peer") and
report that as their own error, so the dead rank is blamed, not the first report the monitor reads.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from multiprocessing import connection

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.core.threads import exit_signals_blocked, start_helper_thread
from engine.errors import ModelLoadError
from engine.runner.build import RunnerSettings
from engine.runner.executor import ExecutorStats
from engine.runner.main_guard import unguarded_main_line
from engine.runner.step_plan import StepPlan
from engine.runner.tp_worker import HEARTBEAT_INTERVAL, LOOPBACK, STEP, STOP, WorkerSpec, run_worker

HEARTBEAT_TIMEOUT = 5.0   # seconds without a heartbeat after which a rank counts as hung
START_TIMEOUT = 600.0     # seconds a rank may take to import, join and load its shard
STOP_TIMEOUT = 5.0        # seconds ranks get to exit cleanly on close() before they are killed
POLL_INTERVAL = 0.05

log = logging.getLogger(__name__)


class WorkerFailure(RuntimeError):
    """A tensor-parallel rank died, hung or failed; the executor is unusable and its workers are gone."""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class _Rank:
    """The engine's view of one worker process."""

    def __init__(self, rank: int, process, status):
        self.rank = rank
        self.process = process
        self.status = status
        self.info: dict | None = None
        self.error: tuple[float, str] | None = None  # (monotonic time in the worker, message) of its failure
        self.counters: dict = {}
        self.last_seen: float | None = None
        self.pid = process.pid

    @property
    def name(self) -> str:
        return f"tensor-parallel rank {self.rank} (pid {self.pid})"


class TensorParallelExecutor:
    """Runs each plan on `size` worker processes and returns rank 0's logits."""

    def __init__(self, settings: RunnerSettings, size: int):
        unguarded = unguarded_main_line()
        if unguarded is not None:
            raise ModelLoadError(
                f"tensor_parallel_size={size} starts its workers with multiprocessing's spawn method, which runs the "
                f"main script ({os.path.basename(unguarded[0])}) again in every worker, and this script creates the "
                f"engine at its top level (line {unguarded[1]}), so every worker would create one too: put the code "
                'that creates the engine under `if __name__ == "__main__":` (see docs/tensor-parallelism.md)')
        self.size = size
        self._failure: str | None = None
        self._lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._closed = False
        self._seconds = 0.0
        self._rank0_counters: dict = {}
        with exit_signals_blocked():  # the store's server thread inherits the mask
            self._store = dist.TCPStore(LOOPBACK, 0, is_master=True, wait_for_workers=False)
        self.rendezvous_port = self._store.port
        context = mp.get_context("spawn")
        threads = max(1, torch.get_num_threads() // size)
        self._ranks: list[_Rank] = []
        self._command = None
        try:
            for rank in range(size):
                receive, send = context.Pipe(duplex=False)
                command_here, command_there = context.Pipe() if rank == 0 else (None, None)
                spec = WorkerSpec(rank, size, self.rendezvous_port, threads, os.getpid(), settings)
                process = context.Process(target=run_worker, args=(spec, command_there, send), daemon=True,
                                          name=f"tp-rank-{rank}")
                process.start()
                send.close()
                if command_there is not None:
                    command_there.close()
                    self._command = command_here
                self._ranks.append(_Rank(rank, process, receive))
            self._started = time.monotonic()
            self._monitor = start_helper_thread(self._watch, "tp-monitor")
            self._ready.wait()
            if self._failure is not None:
                raise ModelLoadError(f"tensor-parallel workers could not start: {self._failure}")
        except BaseException:
            self.close()
            raise

    # ---- stepping --------------------------------------------------------------------------------

    def execute(self, plan: StepPlan) -> torch.Tensor:
        """Rank 0's float32 logits for `plan`; raises WorkerFailure if any rank fails meanwhile."""
        with self._step_lock:
            self._raise_if_failed()
            started = time.perf_counter()
            try:
                self._command.send((STEP, plan))
                while not self._command.poll(POLL_INTERVAL):
                    self._raise_if_failed()
                _, rows, counters = self._command.recv()
            except (EOFError, OSError):
                self._raise_after_broken_pipe()
            self._seconds += time.perf_counter() - started
            self._rank0_counters = counters
            return torch.from_numpy(rows)

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise WorkerFailure(f"{self._failure}; this engine cannot continue: close it and build a new one")
        if self._closed:
            raise WorkerFailure("the tensor-parallel executor is closed")

    def _raise_after_broken_pipe(self) -> None:
        """Rank 0's pipe broke, so it has exited or is exiting: give the monitor time to name the cause (rank 0
        may only be reacting to a lost peer, and a loaded machine may not run the monitor for a while)."""
        deadline = time.monotonic() + HEARTBEAT_TIMEOUT
        while self._failure is None and not self._closed and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL)
        self._fail(f"{self._ranks[0].name} closed its pipe to the engine")
        self._raise_if_failed()

    # ---- watching the workers --------------------------------------------------------------------

    def _watch(self) -> None:
        """Read heartbeats and reports; fail everything when a rank exits, errs or goes silent."""
        try:
            self._watch_until_stopped()
        except Exception as error:  # without a monitor nobody would notice a lost rank: stop now
            self._fail(f"the tensor-parallel monitor failed: {type(error).__name__}: {error}")

    def _watch_until_stopped(self) -> None:
        listening = {rank.status: rank for rank in self._ranks}
        exits = {rank.process.sentinel: rank for rank in self._ranks}
        while not self._stopping.is_set() and self._failure is None:
            ready = connection.wait(list(listening) + list(exits), timeout=HEARTBEAT_INTERVAL)
            for item in ready:
                if item in listening:
                    self._drain(listening[item], listening)
            exited = any(item in exits for item in ready)
            if (exited or any(rank.error for rank in self._ranks)) and not self._stopping.is_set():
                self._fail(self._root_cause(listening))
            self._check_heartbeats()

    def _root_cause(self, listening: dict) -> str:
        """Why the executor fails, once some rank has exited or reported an error.

        Every rank is looked at first (exits collected, pipes drained): a rank killed by a signal (which no
        worker does to itself) is the cause, else the earliest error by the workers' own clocks, else a
        rank that exited. Looking only at what woke the monitor would blame whichever report it read first,
        often a healthy peer's "Connection reset by peer".
        """
        ended = [rank for rank in self._ranks if connection.wait([rank.process.sentinel], timeout=0)]
        for rank in ended:
            rank.process.join(1.0)  # its pipe closes a moment before its exit status is there
            self._drain(rank, listening)
        killed = [rank for rank in ended if (rank.process.exitcode or 0) < 0]
        reported = sorted((rank for rank in self._ranks if rank.error), key=lambda rank: rank.error[0])
        if reported and not killed:
            return f"{reported[0].name} failed: {reported[0].error[1]}"
        cause = (killed or ended)[0]
        return f"{cause.name} exited ({describe_exit(cause.process.exitcode)})"

    def _drain(self, rank: _Rank, listening: dict) -> None:
        try:
            while rank.status.poll():
                self._handle(rank, rank.status.recv())
        except (EOFError, OSError):
            listening.pop(rank.status, None)

    def _handle(self, rank: _Rank, message: tuple) -> None:
        kind, body = message
        rank.last_seen = time.monotonic()
        if kind == "beat":
            rank.counters = body
        elif kind == "ready":
            rank.info = body
            if all(r.info is not None for r in self._ranks):
                self._ready.set()
        elif kind == "error":
            rank.error = body

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        for rank in self._ranks:
            if rank.last_seen is None:
                if now - self._started > START_TIMEOUT:
                    self._fail(f"{rank.name} did not start within {START_TIMEOUT:.0f} s")
            elif now - rank.last_seen > HEARTBEAT_TIMEOUT:
                self._fail(f"{rank.name} sent no heartbeat for {now - rank.last_seen:.1f} s (hung or stopped)")

    def _fail(self, reason: str) -> None:
        """Record the first failure and kill every worker (peers of a lost rank would block in collectives)."""
        with self._lock:
            if self._failure is not None or self._closed:
                return
            self._failure = reason
            log.error("tensor parallelism failed: %s", reason)
            for rank in self._ranks:
                if rank.process.is_alive():
                    rank.process.kill()
        self._ready.set()

    # ---- figures and shutdown ----------------------------------------------------------------------

    def stats(self) -> ExecutorStats:
        infos = [rank.info or {} for rank in self._ranks]
        counters = [self._rank0_counters or self._ranks[0].counters] + [rank.counters for rank in self._ranks[1:]]
        return ExecutorStats(
            rank_pids=[rank.pid for rank in self._ranks],
            rank_weights_bytes=[info.get("weights_bytes", 0) for info in infos],
            rank_kv_cache_bytes=[info.get("kv_cache_bytes", 0) for info in infos],
            rank_threads=[info.get("threads", 0) for info in infos],
            rank_collective_seconds=[c.get("collective_seconds", 0.0) for c in counters],
            executor_seconds=self._seconds, collective_seconds=counters[0].get("collective_seconds", 0.0),
            failure=self._failure)

    def close(self) -> None:
        """Stop the workers (killing any that do not exit in time), then free pipes and the rendezvous port."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stopping.set()
        if self._failure is None and self._command is not None:
            try:
                self._command.send((STOP, None))
            except OSError:
                pass
        deadline = time.monotonic() + STOP_TIMEOUT
        for rank in self._ranks:
            rank.process.join(max(0.0, deadline - time.monotonic()))
        for rank in self._ranks:
            if rank.process.is_alive():
                rank.process.kill()
            rank.process.join()
        monitor = getattr(self, "_monitor", None)
        if monitor is not None:
            monitor.join()
        for rank in self._ranks:
            rank.process.close()
            rank.status.close()
        if self._command is not None:
            self._command.close()
        self._store = None

