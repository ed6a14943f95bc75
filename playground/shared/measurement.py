"""Measuring configurations from the page: a background job that leases engines from the pool and
runs the bench's own measurement (`engine.measure_engine`) on them, one at a time.

Why a module: Compare and Benchmark both need the same life around a measurement. It runs in a
thread so the page can poll it (its place in the queue for the server's measurement slot, phase,
requests done, the engine's steps so far for live charts); it measures only once its place holds
the slot (`measurement_slot.py`), and gives the place back when it ends; it holds one engine at a
time, so each configuration is timed alone and the pool's memory budget applies as it does for
chat; Cancel, and the slot's time cap, stop it cleanly (nothing more is sent, requests in flight
are cancelled, and the job ends only once every request it sent has finished). A page or an API
client that goes away cancels its job the same way (`MeasurementJob.stop`).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from engine import (
    BenchRequest,
    EngineConfig,
    EngineInfo,
    RequestOutput,
    SamplingParams,
    StepRecord,
    WorkloadSpec,
    measure_engine,
)
from playground.shared.errors import Refused
from playground.shared.measurement_slot import MeasurementSlot, Place
from playground.shared.pool import EnginePool
from playground.shared.zero_gpu import PERPLEXITY_STEPS, ZeroGpuEngine

STOP_WAIT_S = 60.0
TURN_POLL_S = 0.2


@dataclass(frozen=True)
class Measured:
    """What one measurement returns (plain records: in ZeroGPU mode they come back from the GPU call pickled): the
    bench's result (its keys are `engine.bench --json`'s), the outputs, and the engine's steps during the run
    (every request the engine served meanwhile is in them)."""

    info: EngineInfo
    result: dict
    outputs: list[RequestOutput | None]
    steps: list[StepRecord]
    started: float  # time.perf_counter() when its first request was sent
    pieces: list[list[str]]  # each output's text, token by token (empty unless asked for)

    @property
    def elapsed(self) -> float:
        return self.result["duration"]


@dataclass(frozen=True)
class MeasuredRun(Measured):
    """One configuration measured once: a measurement and the configuration it ran."""

    label: str
    config: EngineConfig


class MeasurementJob:
    """Runs `work(job)` in a background thread once `place` holds the slot; the page reads its progress and the
    finished result."""

    def __init__(self, work: Callable[[MeasurementJob], object], slot: MeasurementSlot, place: Place):
        self.cancel = place.cancel
        self.done = threading.Event()
        self.phase = "queued"
        self.ahead = slot.ahead(place)  # measurements before this one, while it is queued
        self.place = place
        self._slot = slot
        self.label = ""
        self.requests_done = 0
        self.requests_total = 0
        self.runs_done = 0
        self.finished: float | None = None
        self.run_started: float | None = None
        self.engine = None  # the engine being measured, while it is
        self.started = time.perf_counter()  # when it was queued, then when its turn came
        self.result = None
        self.error: BaseException | None = None
        self._steps: list[StepRecord] = []
        self._steps_since = 0.0
        self._lock = threading.Lock()
        # run in the caller's context: in ZeroGPU mode `spaces.GPU` finds the visitor's request there (its quota)
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run, work),
                                        name="playground-measure", daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[MeasurementJob], object]) -> None:
        try:
            while not self._slot.wait_turn(self.place, TURN_POLL_S):
                self.ahead = self._slot.ahead(self.place)
                if self.cancel.is_set():
                    raise Refused("stopped before its turn came")
            self.ahead, self.started = 0, time.perf_counter()
            self.result = work(self)
        except BaseException as error:  # shown on the page; the pool and the engine already cleaned up
            self.error = error
        finally:
            self.engine, self.finished = None, time.perf_counter()
            self._slot.release(self.place)
            self.done.set()

    @property
    def seconds(self) -> float:
        """How long the job has run (until it finished)."""
        return (self.finished or time.perf_counter()) - self.started

    def wait(self, timeout: float | None) -> bool:
        return self.done.wait(timeout)

    def follow(self, poll_s: float) -> Iterator[MeasurementJob]:
        """Yield this job every `poll_s` while it runs and once when it has ended; closing the generator early
        (the page went away) stops the job."""
        try:
            while not self.wait(poll_s):
                yield self
            yield self
        finally:
            self.stop()

    def stop(self) -> None:
        """Cancel (unless it already finished) and wait until every request the job sent has finished."""
        if not self.done.is_set():
            self.cancel.set()
        self.done.wait(STOP_WAIT_S)

    # ----- progress ----------------------------------------------------------------------------

    def progress(self) -> dict:
        """Where the job is, as plain data (what an API client sees while it waits): its phase, the measurements
        ahead of it while queued, the current run's requests, and the seconds since it was queued or started."""
        return {"phase": self.phase, "ahead": self.ahead, "run": self.label, "requests_done": self.requests_done,
                "requests_total": self.requests_total, "seconds": round(self.seconds, 1),
                "stopping": self.cancel.is_set()}

    def _count(self, _index: int, _output: RequestOutput) -> None:
        with self._lock:
            self.requests_done += 1

    def live_steps(self) -> list[StepRecord]:
        """The measured engine's steps since its run started (gathered as they come, so none are lost to the
        engine's bounded history)."""
        engine = self.engine
        with self._lock:
            if engine is not None and self.run_started is not None:
                fresh = engine.step_history(since=max(self._steps_since, self.run_started))
                if fresh:
                    self._steps.extend(fresh)
                    self._steps_since = fresh[-1].time
            return list(self._steps)

    def _begin_run(self, label: str, engine, total: int) -> None:
        with self._lock:
            self.label, self.engine, self.phase = label, engine, "running"
            self.requests_done, self.requests_total = 0, total
            self.run_started, self._steps, self._steps_since = time.perf_counter(), [], 0.0

    # ----- one configuration -------------------------------------------------------------------

    def measure(self, pool: EnginePool, label: str, config: EngineConfig,
                build_requests: Callable[[object], list[BenchRequest]], sampling: SamplingParams, *,
                spec: WorkloadSpec | None = None, concurrency: int | None = None, warmup: bool = False,
                perplexity: bool = False, goodput_slos: dict | None = None, pieces: bool = False) -> MeasuredRun:
        """Lease `config`'s engine (loading it if needed), measure `build_requests(engine)` on it, release it.

        `sampling` holds what every request samples with (its temperature, top-p, top-k, `ignore_eos`, structured
        output; request i
        uses seed + i, so its seed must be set; each request's own token budget replaces `max_tokens`). With
        `pieces`, each output is also split into the text of its tokens (for marking differences). In ZeroGPU mode
        the whole measurement is one GPU call (`zero_gpu.py`): its progress and live steps arrive when it ends, and
        Cancel cannot reach it (it ends within the duration it asked for).
        """

        def on_phase(phase: str) -> None:
            self.label, self.phase = label, phase

        on_phase("loading")
        with pool.lease(config, on_phase=on_phase) as entry:
            engine = entry.engine
            requests = build_requests(engine)
            plan = Measurement(requests, spec or WorkloadSpec(num_prompts=len(requests), seed=sampling.seed),
                               concurrency or len(requests), sampling, warmup, perplexity, goodput_slos, pieces)
            if isinstance(engine, ZeroGpuEngine):
                with self._lock:
                    self.label, self.phase = label, "running in one ZeroGPU call"
                    self.requests_done, self.requests_total = 0, len(requests)
                seconds = engine.seconds_for(plan.steps(engine.config), f"measuring {label}", plan.arrivals())
                (measured,) = engine.call(measure_job, plan, seconds)
                self.requests_done = len(requests)
            else:
                self._begin_run(label, engine, len(requests))
                measured = plan.run(engine, self.cancel, self._count,
                                    lambda first, last: [s for s in self.live_steps() if first <= s.time <= last])
            self.engine = None
            self.runs_done += 1
            return MeasuredRun(**vars(measured), label=label, config=config)


@dataclass(frozen=True)
class Measurement:
    """One measurement's requests and settings, as plain data (what a ZeroGPU call receives)."""

    requests: list[BenchRequest]
    spec: WorkloadSpec
    concurrency: int
    sampling: SamplingParams
    warmup: bool
    perplexity: bool
    goodput_slos: dict | None
    pieces: bool

    def steps(self, config: EngineConfig) -> float:
        """About how many engine steps it runs: each wave of `concurrency` requests decodes its longest output (the
        warm-up is one more wave), prompts are prefilled `max_num_batched_tokens` at a time, and the perplexity's
        windows are bounded by `zero_gpu.PERPLEXITY_STEPS`."""
        longest = max((r.max_tokens for r in self.requests), default=0)
        waves = -(-len(self.requests) // max(1, self.concurrency)) + self.warmup
        prompts = sum(len(r.prompt) for r in self.requests) / config.max_num_batched_tokens
        return waves * (1 + longest) + prompts + (PERPLEXITY_STEPS if self.perplexity else 0)

    def arrivals(self) -> float:
        """Seconds over which the requests arrive (a request rate spreads them)."""
        return max((r.arrival for r in self.requests), default=0.0)

    def run(self, engine, cancel: threading.Event, on_output: Callable[[int, RequestOutput], None] | None,
            steps_between: Callable[[float, float], list[StepRecord]]) -> Measured:
        """Measure on `engine` (the bench's `measure_engine`); `steps_between(first, last)` gives its steps."""
        sampling = self.sampling
        outputs: list[RequestOutput | None] = [None] * len(self.requests)
        last_done = [time.perf_counter()]

        def keep(index: int, output: RequestOutput) -> None:
            outputs[index], last_done[0] = output, time.perf_counter()
            if on_output is not None:
                on_output(index, output)

        result = measure_engine(engine, self.spec, self.concurrency, sampling.temperature, sampling.ignore_eos,
                                self.warmup, self.perplexity, requests=self.requests, top_p=sampling.top_p,
                                top_k=sampling.top_k, goodput_slos=self.goodput_slos, cancel=cancel, on_output=keep,
                                roofline=True,  # the report has the bench CLI's keys
                                guided=sampling.guided)
        # the measured window: from the first request sent (after the warm-up) to the last one done
        first_sent = last_done[0] - result["duration"]
        pieces = ([token_pieces(engine.tokenizer, o.token_ids if o else []) for o in outputs] if self.pieces
                  else [])
        return Measured(engine.info, result, outputs, steps_between(first_sent, last_done[0]), first_sent, pieces)


def measure_job(engine, plan: Measurement) -> Iterator[Measured]:
    """A measurement inside a ZeroGPU call: on the call's own engine, nothing to cancel it but the call's end."""
    yield plan.run(engine, threading.Event(), None,
                   lambda first, last: [s for s in engine.step_history(since=first) if s.time <= last])


def token_pieces(tokenizer, token_ids: list[int]) -> list[str]:
    """The text each token adds, decoded in context (so spaces and multi-byte characters land where they belong)."""
    if tokenizer is None:
        return [f"<{token}>" for token in token_ids]
    pieces, previous = [], ""
    for end in range(1, len(token_ids) + 1):
        text = tokenizer.decode(token_ids[:end], skip_special_tokens=True)
        pieces.append(text[len(previous):] if text.startswith(previous) else text)
        previous = text
    return pieces
