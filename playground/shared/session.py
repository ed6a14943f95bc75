"""One browser tab's (or one API client's) state, and how handler results reach the page.

Why: every handler needs the same session record (active configuration, conversation, the turns
drawn on the TTFT chart, this session's own activity for the engine-wide charts), and Gradio
keeps one per tab in a `gr.State`. Handlers return their results by output name (`pack`), and the
layout wires components in the order of the same names, so adding an output cannot shift the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gradio as gr

from engine import EngineConfig
from playground.shared.activity import SessionActivity
from playground.shared.conversation import Conversation, Exchange
from playground.shared.run_state import BenchmarkState, CompareState


@dataclass
class Session:
    """One tab: its active configuration and its conversation, plus what its charts need."""

    config: EngineConfig
    conversation: Conversation = field(default_factory=Conversation)
    turns: list[Exchange] = field(default_factory=list)  # every reply of this tab, for the TTFT chart
    kv_samples: list[dict] = field(default_factory=list)
    activity: SessionActivity = field(default_factory=SessionActivity)
    streaming: bool = False
    stop_requested: bool = False  # Stop was pressed: the streaming reply ends at its next delta
    export_paths: list[str] = field(default_factory=list)
    compare: CompareState = field(default_factory=CompareState)
    benchmark: BenchmarkState = field(default_factory=BenchmarkState)


def pack(names: tuple[str, ...], values: dict) -> tuple:
    """The values in the order of `names`; a name without a value leaves its component as it is."""
    unknown = set(values) - set(names)
    if unknown:
        raise KeyError(f"no output named {', '.join(sorted(unknown))}")
    return tuple(values[name] if name in values else gr.skip() for name in names)
