"""The grammar mask of a step: which tokens each guided logits row may take, applied before any sampling.

For every completing request that has a grammar, llguidance fills one bitmask row per logits row of that request:
the row after its last token, then (speculative decoding) one after each proposal, computed by advancing the
matcher through the proposals and rolling it back (as vLLM does). Proposals were already cut at the first token
the grammar rejects (`Speculator.propose`; a sampled draft's rejected token kept once, for exactness), so every
verification row is masked by the state its own prefix reaches, and the rejection rule then accepts only tokens
the grammar allows. Unguided rows are never touched, and
a step without a guided request does no work here at all.

Masks are computed on the engine's loop thread, one request after another: llguidance's parallel executor was
slower on a 2-core CPU (its pool threads wait behind torch's spinning OpenMP threads; docs/structured-outputs.md).

Masked logits are set to -inf in place; rows are then sampled, or verified, exactly as unguided ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import llguidance
import numpy as np
import torch

from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest

BITS = 32


@dataclass(frozen=True)
class MaskResult:
    """What masking a step did: its measured seconds (compute + apply), and requests whose grammar failed."""

    seconds: float
    failed: dict[Request, str]


def apply_grammar_masks(completing: list[ScheduledRequest], logits: torch.Tensor) -> MaskResult | None:
    """Mask the guided rows of `logits` (rows in `completing` order) in place; None when no row is guided.

    Each guided request is charged its share of the measured time by its number of rows.
    """
    guided, rows, row = [], [], 0
    for item in completing:
        if item.request.grammar is not None:
            guided.append((item, row))
            rows.extend(range(row, row + item.num_logits))
        row += item.num_logits
    if not guided:
        return None
    started = time.perf_counter()
    vocab = logits.shape[1]
    words = -(-vocab // BITS)
    bitmask = torch.full((logits.shape[0], words), -1, dtype=torch.int32)
    failed = _fill(guided, bitmask)
    disallowed = np.unpackbits(bitmask.numpy()[rows].view(np.uint8), axis=1, bitorder="little")[:, :vocab] == 0
    _mask_rows(logits, rows, disallowed)
    dead_ends = set(np.flatnonzero(disallowed.all(axis=1)).tolist())
    position = 0
    for item, _ in guided:  # a grammar no token of this vocabulary can continue: say so, not "unusable scores"
        if position in dead_ends and item.request not in failed:
            failed[item.request] = "guided decoding failed: the grammar allows no token of this model's vocabulary here"
        position += item.num_logits
    seconds = time.perf_counter() - started
    for item, _ in guided:
        item.request.guided_mask_s += seconds * item.num_logits / len(rows)
    return MaskResult(seconds, failed)


def _fill(guided: list[tuple[ScheduledRequest, int]], bitmask: torch.Tensor) -> dict[Request, str]:
    """Fill each guided request's rows of `bitmask` on this thread; returns the requests whose grammar failed,
    with the reason (a library exception or an error state fails its own request only)."""
    failed: dict[Request, str] = {}
    for item, start in guided:
        try:
            _fill_request(item.request.grammar.matcher, start, item.speculative_token_ids, bitmask)
        except Exception as error:
            failed[item.request] = f"guided decoding failed: {type(error).__name__}: {error}"
            continue
        error = item.request.grammar.error()
        if error:
            failed[item.request] = f"guided decoding failed: {error}"
    return failed


def _fill_request(matcher: llguidance.LLMatcher, start: int, proposals: list[int], bitmask: torch.Tensor) -> None:
    """Row `start`: the mask after the request's tokens; row `start + j`: after its first j proposals (the
    matcher advances through them, then rolls back to where it was). The walk covers only the proposals the
    grammar accepts (a sampled draft's first rejected one is verified by the row before it; rows past it are never
    used) and ends where the grammar is complete: the request ends there, and llguidance records no token for an
    end it then consumes, so rolling back over one would undo a real token."""
    _fill_row(matcher, bitmask, start)
    consumed = 0
    accepted = proposals[:matcher.validate_tokens(proposals)] if proposals else []
    for offset, token in enumerate(accepted, start=1):
        if matcher.is_stopped() or not matcher.consume_token(token):
            break
        consumed += 1
        _fill_row(matcher, bitmask, start + offset)
    if consumed:
        matcher.rollback(consumed)


def _fill_row(matcher: llguidance.LLMatcher, bitmask: torch.Tensor, row: int) -> None:
    """The matcher's mask into one row of the (CPU, contiguous int32) bitmask: what `llguidance.torch` does, without
    importing it (its import pulls in torch.compile's machinery: seconds)."""
    target = bitmask[row]
    matcher.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * target.element_size())


def _mask_rows(logits: torch.Tensor, rows: list[int], disallowed: np.ndarray) -> None:
    """Set the disallowed tokens of `rows` to -inf in place. On a CPU through numpy, single-threaded: torch's
    parallel kernels on these small tensors waited on busy cores for milliseconds (and the logits are
    inference tensors, which torch updates in place only in inference mode)."""
    if logits.device.type == "cpu":
        values = logits.numpy()
        values[rows] = np.where(disallowed, -np.inf, values[rows])
        return
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    mask = torch.from_numpy(disallowed).to(logits.device)
    with torch.inference_mode():
        logits[index] = logits.index_select(0, index).masked_fill_(mask, float("-inf"))
