"""Pipeline parallelism's figures: per stage busy and idle time, the measured bubble beside the textbook one.

Plain data (no torch), so `engine.info.EngineStats` can carry it. What is measured, and on which clock:
- each stage times its own work on each micro-batch (`time.monotonic()`, CLOCK_MONOTONIC, which is
  system-wide, so the stages' spans and the engine's clock line up): from the moment it has its input
  (the plan for stage 0, the previous stage's hidden states for the others) to the moment its output
  is handed on. That is the stage's busy time;
- the engine times how long work was in flight (`active_seconds`: some micro-batch submitted and its
  logits not yet back). Within that time a stage that is not busy is idle: it waits for input (the
  pipeline's fill and drain, or the engine scheduling and sampling), so idle = active - busy;
- the bubble share is the stages' idle time over their busy + idle time, all stages together; the
  textbook share for a GPipe forward pass with N stages and m equal micro-batches is (N-1)/(m+N-1).
"""

from __future__ import annotations

from dataclasses import dataclass


def textbook_bubble(stages: int, micro_batches: int) -> float:
    """GPipe's forward bubble: of the (m + N - 1) slots each stage waits through, N - 1 are empty."""
    return (stages - 1) / (micro_batches + stages - 1)


def bubble_share(busy: tuple[float, ...] | list[float], active_seconds: float) -> float:
    """Idle over busy + idle, summed over the stages, when each stage could have worked `active_seconds`."""
    if active_seconds <= 0 or not busy:
        return 0.0
    idle = sum(max(active_seconds - b, 0.0) for b in busy)
    return idle / (idle + sum(min(b, active_seconds) for b in busy))


def window_bubble(spans, stages: int, start: float, end: float) -> float:
    """The bubble share within [start, end] from a timeline: 1 - (the stages' busy time inside it) / (stages x its
    length). Used for a steady state, away from the pipeline's fill and drain."""
    length = end - start
    if length <= 0:
        return 0.0
    busy = sum(max(0.0, min(span.end, end) - max(span.start, start)) for span in spans)
    return 1.0 - busy / (stages * length)


@dataclass(frozen=True)
class Span:
    """One stage's work on one micro-batch, on the system-wide monotonic clock."""

    stage: int
    micro_batch: int
    start: float
    end: float


@dataclass(frozen=True)
class PipelineStats:
    """Totals since the engine started (take two and `since()` for a window), plus the most recent spans."""

    stages: int
    micro_batches: int                    # micro-batches a step is split into (flush) or kept in flight (overlap)
    schedule: str                         # "overlap" or "flush"
    micro_batches_run: int
    active_seconds: float                 # wall time with at least one micro-batch in flight
    stage_busy_seconds: tuple[float, ...]
    bytes_between_stages: int             # hidden states (and the small timing records) sent stage k -> k + 1
    timeline: tuple[Span, ...] = ()       # the most recent spans, oldest first (bounded)

    @property
    def stage_idle_seconds(self) -> tuple[float, ...]:
        return tuple(max(self.active_seconds - busy, 0.0) for busy in self.stage_busy_seconds)

    @property
    def bubble_share(self) -> float:
        """Measured: the stages' idle share of the time work was in flight."""
        return bubble_share(self.stage_busy_seconds, self.active_seconds)

    @property
    def textbook_bubble_share(self) -> float:
        """(N-1)/(m+N-1): what a flushed pipeline of equal micro-batches leaves idle, with free hand-overs."""
        return textbook_bubble(self.stages, self.micro_batches)

    def since(self, earlier: PipelineStats) -> PipelineStats:
        """The figures of the work done between `earlier` and these (the timeline is this one's)."""
        return PipelineStats(self.stages, self.micro_batches, self.schedule,
                             self.micro_batches_run - earlier.micro_batches_run,
                             self.active_seconds - earlier.active_seconds,
                             tuple(b - a for a, b in zip(earlier.stage_busy_seconds, self.stage_busy_seconds,
                                                         strict=True)),
                             self.bytes_between_stages - earlier.bytes_between_stages, self.timeline)
