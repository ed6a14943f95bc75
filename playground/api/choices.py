"""Several choices of one prompt (`n`): how many, their seeds, and how their usage is counted.

Why: `n` choices are `n` engine requests of the same prompt, so they share the prompt's KV blocks through the
prefix cache (the later ones wait for the blocks the first one is computing, `BlockManager.waits_for_pending`) and
are batched together. With a seed, choice 0 takes the seed itself (so `n=1` samples what it always did) and choice
i a seed derived from it, distinct from the others and the same on every run; without one, each choice gets the
engine's own random seed. Usage counts each prompt once, as OpenAI bills it, and every choice's tokens.
"""

from __future__ import annotations

from playground.api.errors import APIError
from playground.shared.values import shown

MAX_N = 8
SEED_STRIDE = 0x9E3779B97F4A7C15  # odd, so i * stride differs modulo 2**63 for every choice i
SEED_RANGE = 2**63


def parse_n(body: dict) -> int:
    """The choices asked per prompt: 1 to MAX_N (absent or null: 1)."""
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise APIError(400, f"n must be an integer from 1 to {MAX_N} on this server, got {shown(n)}", param="n")
    return n


def choice_seeds(seed: int | None, n: int) -> list[int | None]:
    """The seed of each of `n` choices: the request's seed for choice 0, derived ones after it."""
    if seed is None:
        return [None] * n
    return [(seed + index * SEED_STRIDE) % SEED_RANGE for index in range(n)]


def usage(metrics: list, n: int) -> dict:
    """OpenAI's `usage` of a call whose `metrics` are its choices in order, `n` per prompt: each prompt's tokens
    (and its cached tokens, as its first choice found them) once, every choice's completion tokens."""
    firsts = metrics[::n]
    prompt = sum(m.prompt_tokens for m in firsts)
    completion = sum(m.output_tokens for m in metrics)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(m.cached_tokens for m in firsts)}}
