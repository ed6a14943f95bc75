"""What a session keeps of its Compare and Benchmark tabs between events.

Why apart from the session: the two tabs' handlers (`playground/compare/`, `playground/benchmark/`) read
and write these, and the session only holds them, so the session needs neither tab.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from playground.shared.conversation import Conversation

MAX_KEPT_RUNS = 12


@dataclass
class CompareState:
    """The comparison in progress and the conversations of "chat with both", one per side."""

    chats: dict[str, Conversation] = field(default_factory=dict)
    job: object | None = None  # the MeasurementJob of a comparison in progress
    chat_stop: bool = False  # Stop was pressed during "chat with both"
    chat_streaming: bool = False


@dataclass
class BenchmarkRecord:
    """One finished (or cancelled) benchmark run of this session, kept to overlay and export."""

    number: int
    label: str
    summary: str  # the configuration measured, `auto` choices as its engine resolved them
    report: dict  # the same keys as `engine.bench --json`
    started: float
    steps: list  # the engine's StepRecords during the run


@dataclass
class BenchmarkState:
    """This session's benchmark runs (newest MAX_KEPT_RUNS) and the one in progress, if any."""

    runs: list[BenchmarkRecord] = field(default_factory=list)
    job: object | None = None  # the MeasurementJob in progress
    next_number: int = 1
    export_paths: list[str] = field(default_factory=list)
