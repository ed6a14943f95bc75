"""The backend contract: what the engine loop calls on the native engine and on the `transformers` baseline.

`Engine` owns requests, threads and history; a backend only turns queued requests into tokens.
Both backends (native, transformers) implement `Backend` from the same `EnginePlan`, so the engine
loop, streaming, cancellation, metrics and the charts behave the same on either and the engine never
reaches into a backend's internals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from engine.core.request import Request
from engine.info import EngineStats, StepRecord
from engine.runner.profiler import DecodeProfile


class Backend(Protocol):
    """Turns the requests the engine hands it into tokens, one `step` at a time, on the engine's loop thread."""

    num_params: int           # parameters of the served model (a draft's apart)
    draft_num_params: int

    def add(self, request: Request) -> None:
        """Queue a validated request (its prompt fits the plan's `max_model_len`)."""

    def abort(self, request: Request) -> None:
        """Take a request out wherever it is (cancelled, failed or finished) and free what it holds."""

    def has_work(self) -> bool:
        """Whether any request is queued or running."""

    def requests(self) -> list[Request]:
        """Every request the backend holds, running or queued."""

    def step(self, record: Callable[[StepRecord], None]) -> None:
        """Advance the running requests. Each model step that runs (the baseline's `generate` runs
        many in one call) is passed to `record` before its tokens reach their requests, so a caller
        who has its output can already see the step. Requests that finish are taken out."""

    def score(self, token_ids: list[int], chunk_tokens: int | None = None) -> torch.Tensor | None:
        """The next-token log-distribution over the vocabulary after each of token_ids[:-1] ([len - 1, vocab],
        float32 on the CPU), through this backend's own forward pass (the perplexity of the loaded configuration
        and the comparison of two), in steps of `chunk_tokens` over the cache where the backend has one of its
        own (Engine.next_token_log_probs). Called on the loop thread between steps; None when it cannot run now
        (its KV cache is busy), to be asked again after a step."""

    def stats(self) -> EngineStats:
        """Current figures."""

    def forget_warm_up(self) -> None:
        """Zero the counters behind `stats()` (steps, peaks, prefix-cache and speculative counts) after the engine's
        warm-up request, so the figures cover the requests the engine serves."""

    def decode_profile(self, since: float) -> DecodeProfile | None:
        """The decode steps finished after `since` against their matmul floor, or None if not profiled."""

    def close(self) -> None:
        """Free the model, the KV cache and any thread or process; the backend is unusable after."""


def next_token_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Each row of `logits` ([positions, vocab]) as a log-distribution over the vocabulary, float32 on the CPU."""
    return torch.log_softmax(logits.float(), dim=-1).cpu()
