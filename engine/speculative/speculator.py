"""What the native backend calls around each step: propose before scheduling, verify after the forward pass.

Proposals are made at the start of a step for the requests already running (vLLM's v1 engine makes
them at the end of the previous step, which comes to the same), so the scheduler can budget tokens
and KV slots for them and the draft model's time counts in the step that uses its proposals.
"""

from __future__ import annotations

from typing import Protocol

import torch

from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest
from engine.model.sampler import SamplingTensors
from engine.speculative.stats import SpecDecodingStats
from engine.speculative.verify import Verified, verify, verify_greedy


class Proposer(Protocol):
    """Suggests tokens; never decides output."""

    def propose(self, requests: list[Request], lengths: list[int]) -> tuple[list[list[int]],
                                                                            list[torch.Tensor | None]]:
        """Up to `lengths[i]` tokens for request i, and the distribution each was drawn from (None: point masses)."""

    def rollback(self, request: Request, num_accepted: int) -> None:
        """The target accepted the first `num_accepted` of this request's proposals."""

    def release(self, request: Request) -> None:
        """The request left the engine."""

    def close(self) -> None:
        """Free whatever the proposer holds."""


class Speculator:
    """Runs a proposer before each step and the rejection rule after it; keeps the statistics."""

    def __init__(self, proposer: Proposer, num_speculative_tokens: int, max_model_len: int):
        self.proposer = proposer
        self.num_speculative_tokens = num_speculative_tokens
        self.max_model_len = max_model_len
        self.stats = SpecDecodingStats(num_speculative_tokens)
        self.proposal_probs: dict[int, torch.Tensor | None] = {}

    def forget_stats(self) -> None:
        """Start the acceptance counts afresh (after the engine's warm-up request)."""
        self.stats = SpecDecodingStats(self.num_speculative_tokens)

    def proposal_length(self, request: Request) -> int:
        """How many tokens to propose: none mid-prompt, and never past max_tokens or the context length
        (a step yields at most the accepted proposals plus one)."""
        if request.num_tokens - request.num_computed_tokens != 1:
            return 0
        remaining = request.params.max_tokens - len(request.output_token_ids)
        return max(min(self.num_speculative_tokens, remaining - 1, self.max_model_len - request.num_tokens - 1), 0)

    def propose(self, running: list[Request]) -> None:
        """Give each running request that is ready to decode its proposals (`Request.spec_token_ids`)."""
        self.proposal_probs.clear()
        if not running:
            return
        proposals, probs = self.proposer.propose(running, [self.proposal_length(r) for r in running])
        for request, tokens, distribution in zip(running, proposals, probs, strict=True):
            if request.grammar is not None:
                tokens = tokens[:self._grammar_cut(request, tokens, distribution)]
            request.spec_token_ids = tokens
            if tokens:
                self.proposal_probs[request.request_id] = distribution

    @staticmethod
    def _grammar_cut(request: Request, tokens: list[int], distribution: torch.Tensor | None) -> int:
        """How many proposals a guided request verifies: those before the first token its grammar rejects, no row
        spent past it. A token drawn from a distribution (a sampled draft) stays, once: the rejection rule refuses
        it (the masked target gives it 0) and draws from the residual max(0, p - q), which keeps the output
        distributed exactly as the masked target. Cutting it would draw from p instead, which is exact only for a
        point-mass proposal (n-gram, greedy draft), whose residual is p itself."""
        valid = request.grammar.valid_prefix(tokens)
        return valid + int(distribution is not None and valid < len(tokens))

    def verify(self, completing: list[ScheduledRequest], logits: torch.Tensor) -> Verified:
        """Tokens for each completing request from its 1 + k logits rows; counts what was accepted."""
        requests = [item.request for item in completing]
        proposals = [list(item.speculative_token_ids) for item in completing]
        if all(r.params.temperature == 0 for r in requests):
            result = verify_greedy(logits, proposals)
        else:
            settings = SamplingTensors.build(
                [r.params.temperature for r in requests], [r.params.top_k for r in requests],
                [r.params.top_p for r in requests], [r.seed for r in requests],
                [len(r.output_token_ids) for r in requests], logits.device)
            result = verify(logits, proposals, settings, [self.proposal_probs.get(r.request_id) for r in requests])
        for request, proposed, accepted in zip(requests, proposals, result.num_accepted, strict=True):
            self.proposer.rollback(request, accepted)
            if proposed:
                request.spec_proposed += len(proposed)
                request.spec_accepted += accepted
                request.spec_drafts += 1
                self.stats.observe(len(proposed), accepted)
        return result

    def release(self, request: Request) -> None:
        self.proposal_probs.pop(request.request_id, None)
        self.proposer.release(request)

    def close(self) -> None:
        self.proposer.close()
        self.proposal_probs.clear()
