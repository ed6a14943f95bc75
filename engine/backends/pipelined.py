"""`PipelinedBackend`: the native backend when pipeline stages overlap micro-batches ("virtual engines").

With the overlap schedule the running batch is split into m micro-batches that are kept in flight
across steps, as vLLM keeps one batch per virtual engine: while stage 1 works on micro-batch A,
stage 0 works on B. One engine step is then:
1. submit: if fewer than m micro-batches are in flight, schedule the requests that are not in flight
   (the scheduler skips those: `Scheduler.schedule(busy=...)`, and never preempts them) and submit
   them as up to (m - in flight) micro-batches of even size;
2. collect the oldest micro-batch's logits and process it like a one-stage step (sample, deliver,
   record, commit its blocks); its requests can be scheduled again at the next step.
A request belongs to at most one in-flight micro-batch. Requests that are cancelled, or that fail,
while their micro-batch is in flight keep their blocks (stages are writing K/V into them) until it
comes back; then they leave without taking tokens. The flush schedule needs none of this: its step
is an ordinary step whose execution the executor splits (`PipelineExecutor.execute`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.backends.native import NativeBackend
from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest
from engine.info import StepRecord
from engine.plan import EnginePlan
from engine.runner.pp_executor import PipelineExecutor, split_evenly
from engine.runner.step_plan import StepPlan, plan_step


@dataclass
class _InFlight:
    ticket: int
    scheduled: list[ScheduledRequest]
    plan: StepPlan
    submitted: float


class PipelinedBackend(NativeBackend):
    """Keeps up to `executor.micro_batches` micro-batches in the pipe; each `step` processes the oldest."""

    def __init__(self, plan: EnginePlan):
        super().__init__(plan)
        if not isinstance(self.executor, PipelineExecutor):
            raise TypeError("PipelinedBackend runs over pipeline stages (pipeline_parallel_size > 1)")
        self.limit = self.executor.micro_batches
        self.in_flight: deque[_InFlight] = deque()
        self.busy: set[int] = set()       # ids of requests in an in-flight micro-batch
        self.leaving: set[int] = set()    # of those, the ones cancelled meanwhile

    def abort(self, request: Request) -> None:
        """Remove `request` now, or, when its micro-batch is in flight, once that is back (stages write its K/V)."""
        if request.request_id in self.busy:
            self.leaving.add(request.request_id)
            return
        self._remove(request)

    def step(self, record: Callable[[StepRecord], None]) -> None:
        self._submit()
        if not self.in_flight:
            return
        oldest = self.in_flight.popleft()
        self.busy.difference_update(item.request.request_id for item in oldest.scheduled)
        staying = [item for item in oldest.scheduled if item.request.request_id not in self.leaving]
        gone = [item for item in oldest.scheduled if item.request.request_id in self.leaving]
        for item in gone:
            self.leaving.discard(item.request.request_id)
            self._remove(item.request)
        self._run_and_deliver(staying, oldest.plan, oldest.submitted, oldest.submitted, record,
                                      lambda: self._rows_of(staying, oldest))

    def _submit(self) -> None:
        room = self.limit - len(self.in_flight)
        if room <= 0:
            return
        scheduled = self.scheduler.schedule(busy=self.busy)
        for group in split_evenly(scheduled, room) if scheduled else []:
            submitted = time.perf_counter()
            plan = plan_step(group)
            self.busy.update(item.request.request_id for item in group)
            try:
                ticket = self.executor.submit(plan)
            except Exception as error:  # a stage failed: these requests fail now, those in flight when collected
                self.busy.difference_update(item.request.request_id for item in group)
                self._fail([item.request for item in group], error)
                continue
            self.in_flight.append(_InFlight(ticket, group, plan, submitted))

    def _rows_of(self, staying: list[ScheduledRequest], batch: _InFlight) -> torch.Tensor:
        """The micro-batch's logits, only the rows of the requests that stay (all of them but the cancelled)."""
        logits = self.executor.collect(batch.ticket)
        if len(staying) == len(batch.scheduled):
            return logits
        rows, row = [], 0
        keep = {id(item) for item in staying}
        for item in batch.scheduled:
            if id(item) in keep:
                rows.extend(range(row, row + item.num_logits))
            row += item.num_logits
        return logits[torch.tensor(rows, dtype=torch.long)]
