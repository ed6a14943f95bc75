"""Sampling parameters and the sampler that turns a batch of logits into next tokens.

Requests with different parameters share one batch: greedy rows take an argmax, the others go
through temperature, top-k and top-p and draw from their own seeded generator, so a request with
a seed gets the same tokens whatever else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.errors import RequestError


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens and when it stops."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop or ()))

    def validate(self) -> SamplingParams:
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not isinstance(self.temperature, int | float) or self.temperature < 0:
            raise RequestError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_p, int | float) or not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise RequestError(f"top_k must be >= 0 (0 = off), got {self.top_k!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise RequestError(f"seed must be an integer or None, got {self.seed!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise RequestError(f"stop must be non-empty strings, got {self.stop!r}")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) on one row of float32 logits."""
    logits = logits / temperature
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        outside = (torch.cumsum(probs, dim=-1) - probs) > top_p
        sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
        logits = torch.empty_like(logits).scatter_(0, order, sorted_logits)
    return logits


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]) -> list[int]:
    """Pick one token per row of `logits` ([batch, vocab]) according to each row's parameters."""
    tokens = torch.argmax(logits, dim=-1).tolist()
    for row, (row_params, generator) in enumerate(zip(params, generators, strict=True)):
        if row_params.greedy:
            continue
        filtered = filter_logits(logits[row].float(), row_params.temperature, row_params.top_k, row_params.top_p)
        probs = torch.softmax(filtered, dim=-1)
        tokens[row] = int(torch.multinomial(probs.cpu(), 1, generator=generator).item())
    return tokens
