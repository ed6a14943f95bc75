"""`PipelineExecutor`: N stage processes, each with a contiguous range of the model's layers and their KV pool.

Design (docs/pipeline-parallelism.md): every stage is a worker process (`pp_worker.py`) supervised by
a `WorkerGang`, like tensor-parallel ranks (heartbeats, a dead stage failing callers within seconds
naming its stage and cause, nothing left after `close()`). The engine sends each micro-batch's plan
(plain data) to every stage over its pipe; hidden states go stage k -> k+1 over a pipe between the two
(NCCL point-to-point on GPUs); the last stage sends the logits back over its pipe. The engine's process never sits
in a collective, only on pipes it polls for failure.

Two ways in:
- `submit(plan)` / `collect(ticket)`: several micro-batches in flight at once (the overlap schedule,
  `engine/backends/pipelined.py`); logits come back in submission order;
- `execute(plan)`: one step; with the flush schedule the plan is split into m micro-batches which all
  enter the pipe before the first result is awaited, and the step waits for all of them (GPipe's forward
  pass, whose bubble is (N-1)/(m+N-1)).
"""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
import torch
import torch.multiprocessing as mp

from engine.pipeline_stats import PipelineStats, Span
from engine.runner.build import RunnerSettings
from engine.runner.executor import ExecutorStats
from engine.runner.pp_worker import SPAN_FIELDS, StageSpec, head_cost_in_layers, run_stage, stage_layers
from engine.runner.step_plan import StepPlan
from engine.runner.worker_gang import WorkerGang
from engine.runner.worker_process import STEP

TIMELINE_SPANS = 2048  # the most recent stage spans kept for the timeline


def pipeline_micro_batches(config) -> int:
    """Micro-batches per step (flush) or in flight (overlap): as configured, else one per stage."""
    return config.pipeline_micro_batches or config.pipeline_parallel_size


def split_evenly(items: list, parts: int) -> list[list]:
    """`items` in at most `parts` contiguous groups whose sizes differ by at most one (no empty group)."""
    parts = max(1, min(parts, len(items)))
    base, extra = divmod(len(items), parts)
    groups, start = [], 0
    for part in range(parts):
        stop = start + base + (part < extra)
        groups.append(items[start:stop])
        start = stop
    return groups


class PipelineExecutor:
    """Runs plans through `size` stage processes and returns the last stage's logits."""

    def __init__(self, settings: RunnerSettings, size: int, micro_batches: int, schedule: str):
        self.size = size
        self.micro_batches = micro_batches
        self.schedule = schedule
        self.layers = stage_layers(settings.spec.num_layers, size, head_cost_in_layers(settings.spec))
        self._lock = threading.Lock()
        self._seconds = 0.0
        self._next_ticket = 0
        self._in_flight: deque[int] = deque()
        self._done: dict[int, np.ndarray] = {}
        self._mark: float | None = None  # when in-flight time was last accounted
        self._active = 0.0
        self._busy = [0.0] * size
        self._bytes = 0
        self._run = 0
        self._timeline: deque[Span] = deque(maxlen=TIMELINE_SPANS)
        threads = max(1, torch.get_num_threads() // size)
        # One-way pipes stage k -> k+1 (hand-overs); this process drops its copies once the stages have theirs,
        # so a stage whose neighbour dies reads end-of-file instead of waiting.
        links = [mp.get_context("spawn").Pipe(duplex=False) for _ in range(size - 1)]
        try:
            self.gang = WorkerGang(
                f"pipeline_parallel_size={size}", [f"pipeline stage {stage}" for stage in range(size)],
                lambda stage, port, parent: StageSpec(
                    stage, size, self.layers[stage], port, threads, parent, settings,
                    link_in=links[stage - 1][0] if stage > 0 else None,
                    link_out=links[stage][1] if stage < size - 1 else None),
                run_stage, set(range(size)))
        finally:
            for receive, send in links:
                receive.close()
                send.close()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def submit(self, plan: StepPlan) -> int:
        """Send `plan` into the pipe; returns the ticket `collect` takes. WorkerFailure if a stage failed."""
        ticket = self._next_ticket
        self._next_ticket += 1
        for stage in range(self.size):
            self.gang.send(stage, (STEP, (ticket, plan)))
        if not self._in_flight:
            self._mark = time.monotonic()
        self._in_flight.append(ticket)
        return ticket

    def collect(self, ticket: int) -> torch.Tensor:
        """float32 logits of the micro-batch `ticket` (results of earlier ones are kept for their own collect)."""
        started = time.perf_counter()
        while ticket not in self._done:
            _, (_, done, rows, spans) = self.gang.receive([self.size - 1])
            self._account(done, spans)
            self._done[done] = rows
        self._seconds += time.perf_counter() - started
        return torch.from_numpy(self._done.pop(ticket))

    def _account(self, ticket: int, spans: list[float]) -> None:
        now = time.monotonic()
        self._in_flight.remove(ticket)
        self._active += now - self._mark
        self._mark = now if self._in_flight else None
        self._run += 1
        for stage in range(self.size):
            start, end, sent = spans[SPAN_FIELDS * stage:SPAN_FIELDS * (stage + 1)]
            self._busy[stage] += end - start
            self._bytes += int(sent)
            self._timeline.append(Span(stage, ticket, start, end))

    def execute(self, plan: StepPlan) -> torch.Tensor:
        """Logits of `plan`; with the flush schedule its sequences go through as m micro-batches."""
        with self._lock:
            if self.schedule != "flush":
                return self.collect(self.submit(plan))
            groups = split_evenly(plan.chunks, self.micro_batches)
            tickets = [self.submit(StepPlan(group)) for group in groups]
            return torch.cat([self.collect(ticket) for ticket in tickets])

    def pipeline_stats(self) -> PipelineStats:
        return PipelineStats(self.size, self.micro_batches, self.schedule, self._run, self._active,
                             tuple(self._busy), self._bytes, tuple(self._timeline))

    def stats(self) -> ExecutorStats:
        infos = self.gang.infos()
        return ExecutorStats(
            rank_pids=self.gang.pids,
            rank_weights_bytes=[info.get("weights_bytes", 0) for info in infos],
            rank_kv_cache_bytes=[info.get("kv_cache_bytes", 0) for info in infos],
            rank_threads=[info.get("threads", 0) for info in infos],
            rank_collective_seconds=[0.0] * self.size,
            executor_seconds=self._seconds, collective_seconds=0.0, failure=self.gang.failure,
            pipeline=self.pipeline_stats())

    def close(self) -> None:
        """Stop the stages (killing any that do not exit in time), then free pipes and the rendezvous port."""
        self.gang.close()
