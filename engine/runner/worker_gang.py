"""`WorkerGang`: the engine's side of its worker processes: start them, hear their heartbeats, fail fast, clean up.

Every executor that runs the model outside the engine's process (tensor-parallel ranks, pipeline
stages, disaggregated prefill and decode workers) starts its workers here, so they all share one
behaviour:
- workers are spawned (safe with threads and CUDA) and meet over a rendezvous `TCPStore` on a free
  loopback port the OS picks; the store belongs to the gang, so its port goes with `close()`;
- a monitor thread reads each worker's heartbeats and watches the processes: a worker that exits,
  reports an error, or misses heartbeats for `HEARTBEAT_TIMEOUT` seconds fails the gang at once:
  every worker is killed, and whatever the engine waits for (and anything later) raises
  `WorkerFailure` naming the root cause. When one worker dies its peers fail in their next
  collective ("Connection reset by peer") and report that as their own error, so the dead worker is
  blamed, not the first report the monitor reads;
- the engine's process never sits inside a collective: it talks to workers over pipes it can time
  out, so a dead or stuck worker can never hang it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing import connection

import torch.distributed as dist
import torch.multiprocessing as mp

from engine.core.threads import exit_signals_blocked, start_helper_thread
from engine.errors import ModelLoadError
from engine.runner.main_guard import unguarded_main_line
from engine.runner.worker_process import HEARTBEAT_INTERVAL, LOOPBACK, STOP

HEARTBEAT_TIMEOUT = 5.0   # seconds without a heartbeat after which a worker counts as hung
START_TIMEOUT = 600.0     # seconds a worker may take to import, join and load its part of the model
STOP_TIMEOUT = 5.0        # seconds workers get to exit cleanly on close() before they are killed
POLL_INTERVAL = 0.05

log = logging.getLogger(__name__)


class WorkerFailure(RuntimeError):
    """A worker process died, hung or failed; its executor is unusable and its workers are gone."""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class _Member:
    """The engine's view of one worker process."""

    def __init__(self, name: str, process, status, command):
        self.name = f"{name} (pid {process.pid})"
        self.process = process
        self.status = status
        self.command = command
        self.info: dict | None = None
        self.error: tuple[float, str] | None = None  # (monotonic time in the worker, message) of its failure
        self.counters: dict = {}
        self.last_seen: float | None = None
        self.pid = process.pid


class WorkerGang:
    """`len(specs)` spawned workers, each running `entry(spec, command, status)`; commands go to those in
    `commanded` (indices) over a duplex pipe each.

    `setting` names the configuration that needs workers (e.g. "tensor_parallel_size=2"), for the
    message that refuses to start them from an unguarded main script; `spec_for(index, port,
    parent_pid)` builds each worker's picklable spec once the rendezvous port is known; `names[i]`
    is how errors name worker i ("pipeline stage 1").
    """

    def __init__(self, setting: str, names: list[str], spec_for: Callable[[int, int, int], object],
                 entry: Callable, commanded: set[int]):
        unguarded = unguarded_main_line()
        if unguarded is not None:
            raise ModelLoadError(
                f"{setting} starts its workers with multiprocessing's spawn method, which runs the main script "
                f"({os.path.basename(unguarded[0])}) again in every worker, and this script creates the engine at "
                f"its top level (line {unguarded[1]}), so every worker would create one too: put the code that "
                'creates the engine under `if __name__ == "__main__":` (see docs/tensor-parallelism.md)')
        self._failure: str | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._closed = False
        self.members: list[_Member] = []
        with exit_signals_blocked():  # the store's server thread inherits the mask
            self._store = dist.TCPStore(LOOPBACK, 0, is_master=True, wait_for_workers=False)
        self.rendezvous_port = self._store.port
        context = mp.get_context("spawn")
        try:
            for index, name in enumerate(names):
                receive, send = context.Pipe(duplex=False)
                command_here, command_there = context.Pipe() if index in commanded else (None, None)
                process = context.Process(target=entry, daemon=True, name=name.replace(" ", "-"),
                                          args=(spec_for(index, self.rendezvous_port, os.getpid()), command_there,
                                                send))
                process.start()
                send.close()
                if command_there is not None:
                    command_there.close()
                self.members.append(_Member(name, process, receive, command_here))
            self._started = time.monotonic()
            self._monitor = start_helper_thread(self._watch, "worker-monitor")
            self._ready.wait()
            if self._failure is not None:
                raise ModelLoadError(f"the workers could not start: {self._failure}")
        except BaseException:
            self.close()
            raise

    # ---- talking to workers -----------------------------------------------------------------------

    def send(self, index: int, message) -> None:
        """Send a command to worker `index`; WorkerFailure if the gang has failed or the pipe is broken."""
        self.raise_if_failed()
        try:
            self.members[index].command.send(message)
        except OSError:
            self._raise_after_broken_pipe(index)

    def receive(self, indices: list[int]) -> tuple[int, object]:
        """The next reply from whichever of the workers `indices` answers first, as (index, message); waits,
        checking for failure every `POLL_INTERVAL`."""
        pipes = {self.members[index].command: index for index in indices}
        while True:
            self.raise_if_failed()
            ready = connection.wait(list(pipes), timeout=POLL_INTERVAL)
            if ready:
                index = pipes[ready[0]]
                try:
                    return index, self.members[index].command.recv()
                except (EOFError, OSError):
                    self._raise_after_broken_pipe(index)

    def raise_if_failed(self) -> None:
        if self._failure is not None:
            raise WorkerFailure(f"{self._failure}; this engine cannot continue: close it and build a new one")
        if self._closed:
            raise WorkerFailure("the engine's workers are closed")

    def _raise_after_broken_pipe(self, index: int) -> None:
        """A worker's pipe broke, so it has exited or is exiting: give the monitor time to name the cause (it may
        only be reacting to a lost peer, and a loaded machine may not run the monitor for a while)."""
        deadline = time.monotonic() + HEARTBEAT_TIMEOUT
        while self._failure is None and not self._closed and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL)
        self._fail(f"{self.members[index].name} closed its pipe to the engine")
        self.raise_if_failed()

    # ---- watching the workers --------------------------------------------------------------------

    def _watch(self) -> None:
        """Read heartbeats and reports; fail everything when a worker exits, errs or goes silent."""
        try:
            self._watch_until_stopped()
        except Exception as error:  # without a monitor nobody would notice a lost worker: stop now
            self._fail(f"the worker monitor failed: {type(error).__name__}: {error}")

    def _watch_until_stopped(self) -> None:
        listening = {member.status: member for member in self.members}
        exits = {member.process.sentinel: member for member in self.members}
        while not self._stopping.is_set() and self._failure is None:
            ready = connection.wait(list(listening) + list(exits), timeout=HEARTBEAT_INTERVAL)
            for item in ready:
                if item in listening:
                    self._drain(listening[item], listening)
            exited = any(item in exits for item in ready)
            if (exited or any(member.error for member in self.members)) and not self._stopping.is_set():
                self._fail(self._root_cause(listening))
            self._check_heartbeats()

    def _root_cause(self, listening: dict) -> str:
        """Why the gang fails, once some worker has exited or reported an error.

        Every worker is looked at first (exits collected, pipes drained): a worker killed by a signal (which no
        worker does to itself) is the cause, else the earliest error by the workers' own clocks, else a
        worker that exited. Looking only at what woke the monitor would blame whichever report it read first,
        often a healthy peer's "Connection reset by peer".
        """
        ended = [member for member in self.members if connection.wait([member.process.sentinel], timeout=0)]
        for member in ended:
            member.process.join(1.0)  # its pipe closes a moment before its exit status is there
            self._drain(member, listening)
        killed = [member for member in ended if (member.process.exitcode or 0) < 0]
        reported = sorted((member for member in self.members if member.error), key=lambda member: member.error[0])
        if reported and not killed:
            return f"{reported[0].name} failed: {reported[0].error[1]}"
        cause = (killed or ended)[0]
        return f"{cause.name} exited ({describe_exit(cause.process.exitcode)})"

    def _drain(self, member: _Member, listening: dict) -> None:
        try:
            while member.status.poll():
                self._handle(member, member.status.recv())
        except (EOFError, OSError):
            listening.pop(member.status, None)

    def _handle(self, member: _Member, message: tuple) -> None:
        kind, body = message
        member.last_seen = time.monotonic()
        if kind == "beat":
            member.counters = body
        elif kind == "ready":
            member.info = body
            if all(m.info is not None for m in self.members):
                self._ready.set()
        elif kind == "error":
            member.error = body

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        for member in self.members:
            if member.last_seen is None:
                if now - self._started > START_TIMEOUT:
                    self._fail(f"{member.name} did not start within {START_TIMEOUT:.0f} s")
            elif now - member.last_seen > HEARTBEAT_TIMEOUT:
                self._fail(f"{member.name} sent no heartbeat for {now - member.last_seen:.1f} s (hung or stopped)")

    def _fail(self, reason: str) -> None:
        """Record the first failure and kill every worker (peers of a lost worker would block in collectives)."""
        with self._lock:
            if self._failure is not None or self._closed:
                return
            self._failure = reason
            log.error("engine workers failed: %s", reason)
            for member in self.members:
                if member.process.is_alive():
                    member.process.kill()
        self._ready.set()

    # ---- figures and shutdown ----------------------------------------------------------------------

    @property
    def failure(self) -> str | None:
        """Why the workers can no longer run steps, or None while they can."""
        return self._failure

    def infos(self) -> list[dict]:
        """What each worker described when it was ready (empty for one that never was)."""
        return [member.info or {} for member in self.members]

    def counters(self) -> list[dict]:
        """Each worker's counters as of its last heartbeat."""
        return [member.counters for member in self.members]

    @property
    def pids(self) -> list[int]:
        return [member.pid for member in self.members]

    def close(self) -> None:
        """Stop the workers (killing any that do not exit in time), then free pipes and the rendezvous port."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stopping.set()
        if self._failure is None:
            for member in self.members:
                if member.command is not None:
                    try:
                        member.command.send((STOP, None))
                    except OSError:
                        pass
        deadline = time.monotonic() + STOP_TIMEOUT
        for member in self.members:
            member.process.join(max(0.0, deadline - time.monotonic()))
        for member in self.members:
            if member.process.is_alive():
                member.process.kill()
            member.process.join()
        monitor = getattr(self, "_monitor", None)
        if monitor is not None:
            monitor.join()
        for member in self.members:
            member.process.close()
            member.status.close()
            if member.command is not None:
                member.command.close()
        self._store = None
