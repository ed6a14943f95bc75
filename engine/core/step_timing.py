"""Timing of engine steps where their time is spent: named sections inside each step, page faults.

The native backend marks a step's start, its laps (scheduling, model execution, grammar masks, sampling) and its
end; code deep inside the step (attention, KV writes, the LM head) times itself with
`with section("attention"):`, which finds the step being profiled on this thread (each engine
steps on its own loop thread) and costs about a microsecond, or nothing when no step is profiled.
`runner/profiler.py` turns the records into a decode profile against the matmul floor.
"""

from __future__ import annotations

import resource
import threading
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass

HISTORY_STEPS = 4096
# Sections timed inside a step, in the order a profile lists them.
SECTIONS = ("schedule", "prepare", "fused_layers", "attention", "kv_write", "kv_gather", "lm_head", "guided_mask",
            "sample", "deliver")

_active = threading.local()
_NO_SECTION = nullcontext()


@dataclass(frozen=True)
class StepTiming:
    """One step as measured: wall time per section, the same in the loop thread's CPU time, the whole
    process's CPU time, and the process's minor page faults during the step.

    CPU time does not grow when other processes take the cores, so on a busy machine it is the steadier
    measure; the process's counts torch's worker threads too, the loop thread's (`thread_seconds`,
    `thread_sections`) only the thread that runs the step, which is all of it with one torch thread.
    """

    time: float
    decode_only: bool
    batch_size: int
    context_tokens: int
    seconds: float
    cpu_seconds: float
    thread_seconds: float
    sections: dict[str, float]
    thread_sections: dict[str, float]
    minor_faults: int


class _Section:
    __slots__ = ("profiler", "name", "started", "thread_started")

    def __init__(self, profiler: StepProfiler, name: str):
        self.profiler = profiler
        self.name = name
        self.started = self.thread_started = 0.0

    def __enter__(self) -> None:
        self.started = time.perf_counter()
        self.thread_started = time.thread_time()

    def __exit__(self, *exc) -> None:
        self.profiler.add(self.name, time.perf_counter() - self.started, time.thread_time() - self.thread_started)


def section(name: str):
    """Time a named part of the step running on this thread (a no-op when no step is being profiled)."""
    profiler = getattr(_active, "profiler", None)
    return profiler.sections[name] if profiler is not None else _NO_SECTION


class StepProfiler:
    """Keeps the recent steps' timings; the backend calls `start_step`, `lap` and `end_step` around a step."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.history: deque[StepTiming] = deque(maxlen=HISTORY_STEPS)
        self.sections = {name: _Section(self, name) for name in SECTIONS}
        self.current: dict[str, float] = {}
        self.current_thread: dict[str, float] = {}
        self.started = self.last = self.cpu_at_start = self.thread_started = self.thread_last = 0.0
        self.faults_at_start = 0

    def start_step(self) -> None:
        if not self.enabled:
            return
        _active.profiler = self
        self.current, self.current_thread = {}, {}
        self.faults_at_start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self.cpu_at_start = time.process_time()
        self.thread_started = self.thread_last = time.thread_time()
        self.started = self.last = time.perf_counter()

    def add(self, name: str, seconds: float, thread_seconds: float) -> None:
        self.current[name] = self.current.get(name, 0.0) + seconds
        self.current_thread[name] = self.current_thread.get(name, 0.0) + thread_seconds

    def lap(self, name: str) -> None:
        """Count the time since the previous lap (or the step's start) towards `name`."""
        if not self.enabled:
            return
        now, thread_now = time.perf_counter(), time.thread_time()
        self.add(name, now - self.last, thread_now - self.thread_last)
        self.last, self.thread_last = now, thread_now

    def end_step(self, batch_size: int, num_tokens: int, context_tokens: int) -> None:
        """Close the step (the time since the last lap is delivery) and record it."""
        if not self.enabled:
            return
        self.lap("deliver")
        _active.profiler = None
        cpu = time.process_time() - self.cpu_at_start
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.faults_at_start
        self.history.append(StepTiming(self.last, num_tokens == batch_size, batch_size, context_tokens,
                                       self.last - self.started, cpu, self.thread_last - self.thread_started,
                                       self.current, self.current_thread, faults))

    def decode_steps(self, since: float = 0.0) -> list[StepTiming]:
        """The recorded steps that ran one token per sequence and finished after `since` (perf_counter)."""
        return [step for step in list(self.history) if step.decode_only and step.time > since]
