"""Perplexity as the engine measures it: texts -> one token stream -> windows -> mean next-token loss.

The stream is built as the demo model's training program builds its held-out stream (each text
led by the BOS token, concatenated) and cut into windows of `window + 1` tokens that overlap by
one, so every token after the first is predicted exactly once, from at most `window` tokens of
context. A `PerplexityJob` is one such computation in progress: the engine loop scores its
windows one per turn between serving steps, and the caller waits on the job (and sees progress).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError, RequestError

DEFAULT_WINDOW = 256   # the demo model's training context
HELD_OUT_FILE = Path(__file__).resolve().parent.parent.parent / "assets" / "models" / "demo-heldout.json"
HELD_OUT_SOURCE = "demo held-out text"


@dataclass(frozen=True)
class PerplexityResult:
    """exp(mean negative log-likelihood) over `tokens` predicted tokens in `windows` windows."""

    perplexity: float
    mean_nll: float
    tokens: int
    windows: int
    seconds: float
    source: str


def held_out_texts() -> list[str]:
    """The demo model's held-out sample (documents and chats of modules its training never saw)."""
    return list(json.loads(HELD_OUT_FILE.read_text())["texts"])


def token_stream(encoded_texts: list[list[int]], bos_token_id: int | None) -> list[int]:
    """Every text's ids, each led by the BOS token when the tokenizer has one."""
    lead = [] if bos_token_id is None else [bos_token_id]
    return [token for ids in encoded_texts for token in (*lead, *ids)]


def token_windows(stream: list[int], window: int) -> list[list[int]]:
    """Windows of up to `window + 1` tokens overlapping by one (the last may be shorter, but holds >= 2)."""
    return [stream[start:start + window + 1] for start in range(0, len(stream) - 1, window)]


class PerplexityJob:
    """Windows still to score and the loss so far; scored by the engine loop, waited on by the caller."""

    def __init__(self, windows: list[list[int]], source: str):
        if not windows:
            raise RequestError("the text is too short to measure perplexity (it needs at least two tokens)")
        self.windows = windows
        self.source = source
        self.next_index = 0
        self.nll_sum = 0.0
        self.tokens = 0
        self.error: str | None = None
        self.started = time.perf_counter()
        self._changed = threading.Condition()

    @property
    def done(self) -> bool:
        return self.error is not None or self.next_index == len(self.windows)

    def next_window(self) -> list[int]:
        return self.windows[self.next_index]

    def record(self, log_probs) -> None:
        """Add one scored window (`log_probs` of its predicted tokens); called by the engine loop."""
        with self._changed:
            self.nll_sum -= float(log_probs.sum())
            self.tokens += len(log_probs)
            self.next_index += 1
            self._changed.notify_all()

    def fail(self, message: str) -> None:
        with self._changed:
            self.error = message
            self._changed.notify_all()

    def wait(self, progress: Callable[[int, int], None] | None = None) -> PerplexityResult:
        """Block until every window is scored; `progress(done, total)` runs in the caller's thread."""
        reported = -1
        while True:
            with self._changed:
                while self.next_index == reported and not self.done:
                    self._changed.wait()
                scored, finished = self.next_index, self.done
            if progress is not None and scored != reported:
                progress(scored, len(self.windows))
            reported = scored
            if finished:
                break
        if self.error is not None:
            raise EngineError(f"perplexity failed: {self.error}")
        mean_nll = self.nll_sum / self.tokens
        return PerplexityResult(perplexity=math.exp(mean_nll), mean_nll=mean_nll, tokens=self.tokens,
                                windows=len(self.windows), seconds=time.perf_counter() - self.started,
                                source=self.source)
