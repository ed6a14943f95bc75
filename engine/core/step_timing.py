"""Timing of engine steps where their time is spent: named sections inside each step, page faults.

The native backend marks a step's start, its laps (scheduling, model execution, sampling) and its
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
SECTIONS = ("schedule", "prepare", "attention", "kv_write", "kv_gather", "lm_head", "sample", "deliver")

_active = threading.local()
_NO_SECTION = nullcontext()


@dataclass(frozen=True)
class StepTiming:
    """One step as measured: wall time, time per section, the process's CPU time and minor page faults during it.

    CPU time counts every thread of the process (torch's workers included); unlike wall time it does not
    grow when other processes take the cores, so on a busy machine it is the steadier measure.
    """

    time: float
    decode_only: bool
    batch_size: int
    context_tokens: int
    seconds: float
    cpu_seconds: float
    sections: dict[str, float]
    minor_faults: int


class _Section:
    __slots__ = ("profiler", "name", "started")

    def __init__(self, profiler: StepProfiler, name: str):
        self.profiler = profiler
        self.name = name
        self.started = 0.0

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *exc) -> None:
        sections = self.profiler.current
        sections[self.name] = sections.get(self.name, 0.0) + time.perf_counter() - self.started


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
        self.started = self.last = self.cpu_at_start = 0.0
        self.faults_at_start = 0

    def start_step(self) -> None:
        if not self.enabled:
            return
        _active.profiler = self
        self.current = {}
        self.faults_at_start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self.cpu_at_start = time.process_time()
        self.started = self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        """Count the time since the previous lap (or the step's start) towards `name`."""
        if not self.enabled:
            return
        now = time.perf_counter()
        self.current[name] = self.current.get(name, 0.0) + now - self.last
        self.last = now

    def end_step(self, batch_size: int, num_tokens: int, context_tokens: int) -> None:
        """Close the step (the time since the last lap is delivery) and record it."""
        if not self.enabled:
            return
        self.lap("deliver")
        _active.profiler = None
        cpu = time.process_time() - self.cpu_at_start
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.faults_at_start
        self.history.append(StepTiming(self.last, num_tokens == batch_size, batch_size, context_tokens,
                                       self.last - self.started, cpu, self.current, faults))

    def decode_steps(self, since: float = 0.0) -> list[StepTiming]:
        """The recorded steps that ran one token per sequence and finished after `since` (perf_counter)."""
        return [step for step in list(self.history) if step.decode_only and step.time > since]
