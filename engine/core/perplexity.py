"""Perplexity as the engine measures it: texts -> one token stream -> windows -> mean next-token loss.

The stream is built as the demo model's training program builds its held-out stream (each text
led by the BOS token, concatenated) and cut into windows of `window + 1` tokens that overlap by
one, so every token after the first is predicted exactly once, from at most `window` tokens of
context. A `ScoringJob` is one pass over such windows: the engine loop scores them one per turn
between serving steps and the caller reads each window's next-token log-probabilities as they come
(bounded: the loop waits while a scored window is still unread). Perplexity is computed from those
same log-probabilities (`perplexity_of`), so it cannot disagree with what a caller reads.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

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


@dataclass(frozen=True)
class ScoredWindow:
    """One window through the engine's forward pass: row i of `log_probs` ([len(token_ids) - 1, vocab], float32,
    on the CPU) is the log-distribution over the vocabulary of the token after token_ids[:i + 1]."""

    token_ids: list[int]
    log_probs: torch.Tensor

    def target_log_probs(self) -> torch.Tensor:
        """float64 log-probabilities of the tokens that did come next (token_ids[1:])."""
        index = torch.tensor(self.token_ids[1:]).unsqueeze(1)
        return self.log_probs.gather(1, index).squeeze(1).double()


class ScoringJob:
    """Windows scored by the engine loop, one per turn, and handed to the caller in order.

    At most `AHEAD` scored windows wait for the caller: the loop scores the next one only when there is
    room, so a caller reading windows of [positions, vocab] log-probabilities holds a bounded number of
    them however long the text. `wake` tells the loop that room was made (the caller took a window).
    """

    AHEAD = 1

    def __init__(self, windows: list[list[int]], source: str, wake: Callable[[], None],
                 chunk_tokens: int | None = None):
        if not windows:
            raise RequestError("the text is too short to score (it needs at least two tokens)")
        self.windows = windows
        self.source = source
        self.chunk_tokens = chunk_tokens
        self.next_index = 0
        self.error: str | None = None
        self.closed = False
        self._wake = wake
        self._ready: deque[torch.Tensor] = deque()
        self._changed = threading.Condition()

    @property
    def finished(self) -> bool:
        """Nothing more for the loop to do: every window scored, failed, or the caller gone."""
        return self.error is not None or self.closed or self.next_index == len(self.windows)

    def wants_window(self) -> bool:
        """Whether the loop should score the next window now."""
        return not self.finished and len(self._ready) < self.AHEAD

    def next_window(self) -> list[int]:
        return self.windows[self.next_index]

    def record(self, log_probs: torch.Tensor) -> None:
        """Hand over one scored window (its [positions, vocab] log-probabilities); called by the engine loop."""
        with self._changed:
            if not self.closed:
                self._ready.append(log_probs)
            self.next_index += 1
            self._changed.notify_all()

    def fail(self, message: str) -> None:
        with self._changed:
            self.error = message
            self._changed.notify_all()

    def results(self) -> Iterator[ScoredWindow]:
        """Every window in order as the loop scores it; closing this iterator early stops the scoring."""
        try:
            for window in self.windows:
                with self._changed:
                    while not self._ready and self.error is None:
                        self._changed.wait()
                    if self.error is not None:
                        raise EngineError(f"scoring failed: {self.error}")
                    log_probs = self._ready.popleft()
                self._wake()
                yield ScoredWindow(window, log_probs)
        finally:
            with self._changed:
                self.closed = True
                self._ready.clear()


class NextTokenLoss:
    """The running sum of next-token losses over scored windows: what perplexity is the exp of the mean of."""

    def __init__(self):
        self.nll_sum = 0.0
        self.tokens = 0

    def add(self, window: ScoredWindow) -> None:
        target = window.target_log_probs()
        self.nll_sum -= float(target.sum())
        self.tokens += len(target)

    @property
    def mean_nll(self) -> float:
        return self.nll_sum / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean_nll)


def perplexity_of(windows: Iterable[ScoredWindow], total: int, source: str,
                  progress: Callable[[int, int], None] | None = None) -> PerplexityResult:
    """exp of the mean next-token loss over `total` scored windows; `progress(done, total)` as each arrives."""
    started = time.perf_counter()
    loss = NextTokenLoss()
    if progress is not None:
        progress(0, total)
    for done, window in enumerate(windows, start=1):
        loss.add(window)
        if progress is not None:
            progress(done, total)
    return PerplexityResult(perplexity=loss.perplexity, mean_nll=loss.mean_nll, tokens=loss.tokens, windows=total,
                            seconds=time.perf_counter() - started, source=source)
