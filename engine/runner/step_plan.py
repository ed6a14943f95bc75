"""`StepPlan`: everything a model step needs, as plain data (lists of ints), nothing else.

The scheduler decides who runs; the plan says, per sequence, which tokens get K/V this step, at
which positions, in which KV blocks, and how many positions need logits. It holds no `Request`,
queue or tokenizer, so it can be sent as is to tensor-parallel workers, each of which executes
the same plan on its own shard.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.scheduler import ScheduledRequest


@dataclass(frozen=True)
class SequenceChunk:
    """One sequence's part of a step: `token_ids` at positions `start`, `start + 1`, ...

    `num_logits` of its last positions are scored: 0 for a chunk in the middle of a prompt, 1 for
    a sequence whose next token is sampled, 1 + k when k speculative tokens are verified.
    `seq_id` names the sequence across steps, so that an executor can keep per-sequence state
    (the runner keeps block tables as tensors and only adds the blocks that are new); None = no
    such state (rebuilt for this step).
    """

    token_ids: list[int]
    start: int
    block_table: list[int]
    num_logits: int
    seq_id: int | None = None

    @property
    def end(self) -> int:
        """Context length once this chunk's K/V is written."""
        return self.start + len(self.token_ids)

    @property
    def attention_pairs(self) -> int:
        """(query, key) pairs causal attention scores for this chunk: each new token sees itself and all before."""
        return (self.end * (self.end + 1) - self.start * (self.start + 1)) // 2


@dataclass(frozen=True)
class StepPlan:
    """The sequences of one step, in the order their logits rows come back."""

    chunks: list[SequenceChunk]

    @property
    def num_tokens(self) -> int:
        return sum(len(chunk.token_ids) for chunk in self.chunks)

    @property
    def num_logits(self) -> int:
        return sum(chunk.num_logits for chunk in self.chunks)


def plan_step(scheduled: list[ScheduledRequest]) -> StepPlan:
    """The plan of a scheduled step (the CPU-side preparation every rank's execution starts from)."""
    chunks = []
    for item in scheduled:
        request = item.request
        start = request.num_computed_tokens
        tokens = request.all_token_ids[start:start + item.num_new_tokens] + list(item.speculative_token_ids)
        chunks.append(SequenceChunk(tokens, start, list(item.block_table), item.num_logits, request.request_id))
    return StepPlan(chunks)
