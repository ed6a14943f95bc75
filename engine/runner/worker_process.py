"""The inside of every engine worker process: heartbeats, the death of the engine, fatal errors, a clean exit.

Tensor-parallel ranks, pipeline stages and disaggregated prefill/decode workers are all spawned by a
`WorkerGang` (worker_gang.py) and differ only in what they compute. What they share lives here:
- a heartbeat thread sends the worker's counters to the engine twice a second and ends the process
  as soon as the engine's process is gone (the parent id changes or the pipe breaks), so workers
  never outlive an engine that was killed;
- any exception is fatal: the worker reports it, with the time it happened (so the engine can tell
  a first failure from peers failing after it), and exits; the engine tears the rest down;
- joining the default (gloo) process group over the gang's rendezvous store, with a long timeout,
  since a worker may wait for its next command for as long as the engine is idle.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

import torch.distributed as dist

from engine.core.threads import EXIT_SIGNALS

LOOPBACK = "127.0.0.1"
HEARTBEAT_INTERVAL = 0.5
RENDEZVOUS_TIMEOUT = timedelta(seconds=120)
IDLE_TIMEOUT = timedelta(days=365)          # a worker may wait this long for the next command
COLLECTIVE_TIMEOUT = timedelta(seconds=60)  # inside a step, a longer wait for a peer means a stuck peer
STEP, STOP = "step", "stop"


class StatusChannel:
    """This worker's one-way pipe to the engine, shared by the main and heartbeat threads."""

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


class Worker(Protocol):
    """What a worker process runs once built: it describes itself, then serves commands until told to stop."""

    def describe(self) -> dict:
        """Figures the engine shows for this worker (weights and KV bytes, threads)."""

    def serve(self) -> None:
        """Execute commands until STOP."""


def _heartbeat(channel: StatusChannel, parent_pid: int, counters: dict) -> None:
    while True:
        time.sleep(HEARTBEAT_INTERVAL)
        if os.getppid() != parent_pid:
            os._exit(1)
        channel.send(("beat", dict(counters)))


def join_default_group(store_port: int, rank: int, size: int) -> None:
    """Join the gang's default gloo group (commands, point-to-point transfers) through its rendezvous store."""
    store = dist.TCPStore(LOOPBACK, store_port, is_master=False, timeout=RENDEZVOUS_TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=IDLE_TIMEOUT)


def run_worker_process(build: Callable[[object, object, dict], Worker], spec, command, status) -> None:
    """A worker process's life: `build(spec, command, counters)` makes the worker, which then serves.

    `spec` is the worker's picklable description (it must have `parent_pid`); `command` is its
    pipe from the engine (None for a worker that only hears from its peers); `counters` is the dict
    the heartbeat sends, which the worker updates as it works.
    """
    # A spawned process inherits the signal mask of the thread that started it, which may be an engine helper
    # thread's (SIGINT and SIGTERM blocked): a SIGTERM must reach this process.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, EXIT_SIGNALS)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the engine's to handle; it then stops us
    channel = StatusChannel(status)
    counters: dict = {}
    threading.Thread(target=_heartbeat, args=(channel, spec.parent_pid, counters), name="worker-heartbeat",
                     daemon=True).start()
    try:
        worker = build(spec, command, counters)
        channel.send(("ready", worker.describe()))
        worker.serve()
    except BaseException as error:
        failed_at = time.monotonic()
        traceback.print_exc()
        # The time lets the engine tell a first failure from peers failing after it (CLOCK_MONOTONIC is system-wide).
        channel.send(("error", (failed_at, f"{type(error).__name__}: {error}")))
        os._exit(1)
    if dist.is_initialized():
        dist.destroy_process_group()
    # Nothing is left to flush but stdio; the interpreter's own teardown of torch.distributed would take seconds more.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
