"""Who runs next: continuous or static batching under a token budget, with preemption by recompute.

Every request is a list of tokens of which the first `num_computed_tokens` have K/V in the cache.
A step gives each scheduled request a number of new tokens to compute: the rest of its prompt (or
a chunk of it, when the step's token budget runs out: chunked prefill) or the one token sampled
last step (decode). Prefill and decode are the same thing at different sizes, so one step can mix
them, as vLLM's v1 scheduler does.

- continuous: running requests go first; new requests join whenever the budget, `max_num_seqs`
  and free KV blocks allow. A prompt whose next uncached prefix block is still being computed by
  a running request waits a step, then reuses that block instead of computing it again.
  When a running request needs a block and none is free, the most recently admitted request is
  preempted: its blocks are freed and it goes back to the front of the queue, to be recomputed
  later (its prefix may still be cached).
- static: a batch is gathered only when nothing runs, and runs until its last request finishes;
  nothing joins meanwhile, so finished requests leave their slots idle.

Speculative decoding: a decoding request may carry proposed tokens (`Request.spec_token_ids`);
they ride along after its own new token and cost budget and KV slots like any token, but they
are dropped rather than allowed to preempt anyone. When the pool's blocks also hold a draft
model's K/V (`mirrors_draft_kv`), a block is published to the prefix cache only once both models
have computed it, so a later prompt that hits it finds valid K/V in both.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.core.block_manager import BlockManager
from engine.core.request import Request


@dataclass
class ScheduledRequest:
    """One request's share of a step: how many of its tokens get K/V computed, and where they go.

    `speculative_token_ids` are proposed tokens appended after the request's own tokens for
    verification: they get K/V and logits this step, but only those the sampler accepts become
    output; the cache entries of the rejected ones are overwritten later.
    """

    request: Request
    num_new_tokens: int
    block_table: list[int]
    completes_sequence: bool  # after this step all its tokens have K/V: the last position's logits give the next
    speculative_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, request: Request, num_new_tokens: int, block_manager: BlockManager,
           speculative_token_ids: list[int] | None = None) -> ScheduledRequest:
        completes = request.num_computed_tokens + num_new_tokens == request.num_tokens
        return cls(request, num_new_tokens, block_manager.block_table(request.request_id), completes,
                   list(speculative_token_ids or []))

    @property
    def num_logits(self) -> int:
        """Positions whose logits are sampled: the last one (plus one per speculative token), or none mid-prompt."""
        return 1 + len(self.speculative_token_ids) if self.completes_sequence else 0


class Scheduler:
    """Picks each step's requests and token counts; owns the waiting queue and the running set."""

    def __init__(self, block_manager: BlockManager, batching: str, max_num_seqs: int, max_num_batched_tokens: int,
                 mirrors_draft_kv: bool = False):
        self.block_manager = block_manager
        self.mirrors_draft_kv = mirrors_draft_kv
        self.batching = batching
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.peak_running = 0
        self.num_preemptions = 0
        self.prompt_tokens_admitted = 0
        self.cached_tokens_admitted = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, request: Request) -> None:
        """Take a request out (finished, cancelled or failed) and free its blocks."""
        if request in self.running:
            self.running.remove(request)
            self.block_manager.free(request.request_id)
        elif request in self.waiting:
            self.waiting.remove(request)

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.block_manager.free(request.request_id)
        request.num_computed_tokens = 0
        request.draft_num_computed_tokens = 0
        request.spec_token_ids = []
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def _schedule_running(self, budget: int, busy: frozenset[int] | set[int]) -> tuple[list[ScheduledRequest], int]:
        scheduled: list[ScheduledRequest] = []
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            if request.request_id in busy:
                index += 1
                continue
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            speculative = self._take_speculative(request, num_new, budget, len(self.running) - index - 1)
            target = request.num_computed_tokens + num_new + len(speculative)
            while not self.block_manager.can_grow(request.request_id, target):
                victim = next(r for r in reversed(self.running) if r.request_id not in busy)  # `request` at worst
                self._preempt(victim)
                if victim is request:
                    break
            if request not in self.running:
                break
            self.block_manager.grow(request.request_id, target)
            scheduled.append(ScheduledRequest.of(request, num_new, self.block_manager, speculative))
            budget -= num_new + len(speculative)
            index += 1
        return scheduled, budget

    def _take_speculative(self, request: Request, num_new: int, budget: int, others: int) -> list[int]:
        """The request's proposed tokens that fit this step: only after its last token, within the token
        budget and the KV blocks it holds or that are free beyond one kept for each of the `others`
        running requests scheduled after it (speculation does not push anyone out)."""
        proposed, request.spec_token_ids = request.spec_token_ids, []
        if not proposed or request.num_computed_tokens + num_new != request.num_tokens:
            return []
        manager = self.block_manager
        spare = max(manager.num_free_blocks - others, 0)
        slots = manager.block_size * (len(manager.block_table(request.request_id)) + spare)
        room = min(budget - num_new, slots - request.num_tokens)
        return proposed[:max(room, 0)]

    def _admit(self, budget: int, scheduled: list[ScheduledRequest]) -> None:
        static = self.batching == "static"
        while self.waiting and len(self.running) < self.max_num_seqs and (static or budget > 0):
            request = self.waiting[0]
            tokens = request.all_token_ids
            if not self.block_manager.can_allocate(tokens):
                break
            if not static and self.block_manager.waits_for_pending(tokens):
                break
            cached = self.block_manager.allocate(request.request_id, tokens)
            self.waiting.popleft()
            request.num_computed_tokens = cached
            request.draft_num_computed_tokens = cached
            if request.num_cached_tokens is None:
                request.num_cached_tokens = cached
                self.prompt_tokens_admitted += len(request.prompt_token_ids)
                self.cached_tokens_admitted += cached
            self.running.append(request)
            num_new = min(request.num_tokens - cached, budget)
            if num_new > 0:
                scheduled.append(ScheduledRequest.of(request, num_new, self.block_manager))
                budget -= num_new

    def schedule(self, busy: frozenset[int] | set[int] = frozenset()) -> list[ScheduledRequest]:
        """This step's requests and how many new tokens each computes.

        `busy`: ids of running requests whose previous step is still being computed (a pipeline's
        in-flight micro-batch): they are neither scheduled nor preempted now, but count as running.
        """
        scheduled, budget = self._schedule_running(self.max_num_batched_tokens, busy)
        if self.batching == "continuous" or not self.running:
            self._admit(budget, scheduled)
        self.peak_running = max(self.peak_running, len(self.running))
        return scheduled

    def complete_step(self, scheduled: list[ScheduledRequest]) -> None:
        """Advance each request's computed-token count and publish its newly full blocks to the prefix cache.

        Call it after the step's accepted tokens were appended to their requests. Every token but the
        newest then has K/V: speculative tokens count as computed only where they were accepted (they
        are then the request's own tokens; the slot after them holds a rejected token's K/V, to be
        overwritten), so the prefix cache never hashes a block holding a rejected token's K/V.
        """
        for item in scheduled:
            request = item.request
            computed = request.num_computed_tokens + item.num_new_tokens + len(item.speculative_token_ids)
            request.num_computed_tokens = min(computed, request.num_tokens - 1)
            publishable = request.num_computed_tokens
            if self.mirrors_draft_kv:
                publishable = min(publishable, request.draft_num_computed_tokens)
            self.block_manager.commit(request.request_id, request.all_token_ids, publishable)

    def forget_counts(self) -> None:
        """Zero the counters (peak, preemptions, admitted and cached prompt tokens), e.g. after a warm-up."""
        self.peak_running = self.num_preemptions = 0
        self.prompt_tokens_admitted = self.cached_tokens_admitted = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        if not self.prompt_tokens_admitted:
            return 0.0
        return self.cached_tokens_admitted / self.prompt_tokens_admitted
