"""Counting verification outcomes: acceptance rate, accepted tokens per step, acceptance by position.

The names follow vLLM's (`num_drafts`, `num_draft_tokens`, `num_accepted_tokens`, accepted tokens per
position): a "draft" is one request's proposals verified in one step. vLLM's acceptance length is
1 + accepted / drafts, the tokens a request gains per verification step, the bonus one included.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodingStats:
    """Running totals over every verification step of an engine."""

    num_speculative_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.accepted_per_position:
            self.accepted_per_position = [0] * self.num_speculative_tokens

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One request's verification: `num_draft_tokens` proposed, the first `num_accepted` accepted."""
        if not num_draft_tokens:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed tokens (0 before anything was proposed)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        """Proposed tokens accepted per verification step (vLLM's acceptance length minus the bonus token)."""
        return self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """For each proposal position, the share of verification steps that accepted it."""
        return [count / self.num_drafts if self.num_drafts else 0.0 for count in self.accepted_per_position]
