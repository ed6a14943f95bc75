"""The parts of speculative decoding on their own: the rejection rule, prompt lookup, the scheduler's
bookkeeping of speculative tokens, and the statistics of a constructed case."""

from __future__ import annotations

import pytest
import torch

from engine.core.block_manager import BlockManager
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest, Scheduler
from engine.model.sampler import SamplingTensors, counter_uniform, sample, sample_from
from engine.sampling_params import SamplingParams
from engine.speculative.ngram import NgramIndex
from engine.speculative.speculator import Speculator
from engine.speculative.verify import STREAM_DRAFT, verify, verify_greedy
from tests.support.spec_support import chi_square_p_value

VOCAB = 6


def settings_for(count: int, temperature: float, positions=None, seeds=None, top_k: int = 0) -> SamplingTensors:
    return SamplingTensors.build([temperature] * count, [top_k] * count, [1.0] * count,
                                 seeds if seeds is not None else list(range(count)),
                                 positions if positions is not None else [0] * count, "cpu")


def peaked_logits(argmaxes: list[int]) -> torch.Tensor:
    logits = torch.zeros(len(argmaxes), VOCAB)
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 5.0
    return logits


# ---- the rule -------------------------------------------------------------------------------------


def test_greedy_accepts_up_to_the_first_mismatch_then_takes_the_argmax():
    # request 0: target argmaxes 1 2 3 | 4; proposals 1 2 5 -> accepts 2, then 3
    # request 1: nothing proposed -> the argmax; request 2: all accepted -> the bonus argmax
    logits = peaked_logits([1, 2, 3, 4] + [0] + [5, 5, 2])
    result = verify(logits, [[1, 2, 5], [], [5, 5]], settings_for(3, 0.0))
    assert result.tokens == [[1, 2, 3], [0], [5, 5, 2]]
    assert result.num_accepted == [2, 0, 2]
    assert result.valid == [True, True, True]


def test_the_greedy_rule_gives_what_the_general_rule_gives_greedy_requests():
    generator = torch.Generator().manual_seed(1)
    for trial in range(50):
        counts = torch.randint(0, 5, (4,), generator=generator).tolist()
        logits = torch.randint(0, 3, (sum(counts) + 4, VOCAB), generator=generator).float()  # ties included
        proposals = [torch.randint(0, VOCAB, (count,), generator=generator).tolist() for count in counts]
        row = 0
        for proposal in proposals:  # the first half of each proposal is the target's argmax, so some are accepted
            half = len(proposal) // 2
            proposal[:half] = torch.argmax(logits[row: row + half], dim=-1).tolist()
            row += len(proposal) + 1
        if trial % 5 == 0:
            logits[trial % len(logits), 0] = float("nan")
        assert verify_greedy(logits, proposals) == verify(logits, proposals, settings_for(4, 0.0)), trial


def test_unusable_logits_fail_only_their_request():
    logits = peaked_logits([1, 2, 3, 4])
    logits[1, 0] = float("nan")
    result = verify(logits, [[1], [3]], settings_for(2, 1.0))
    assert result.valid == [False, True]


def test_nothing_proposed_samples_exactly_like_the_plain_sampler():
    logits = torch.randn(64, VOCAB, generator=torch.Generator().manual_seed(0))
    settings = settings_for(64, 0.8, positions=list(range(64)), top_k=4)
    assert verify(logits, [[]] * 64, settings).tokens == [[t] for t in sample(logits, settings).tokens.tolist()]


# Target distributions p_j after each of 2 proposals (and the bonus row), the draft's q_j, and many
# requests drawing their proposals from q: the output tokens must follow p, position by position.
P = torch.tensor([[0.05, 0.40, 0.10, 0.25, 0.15, 0.05],
                  [0.30, 0.05, 0.05, 0.20, 0.10, 0.30],
                  [0.10, 0.10, 0.40, 0.10, 0.20, 0.10]])
Q = torch.tensor([[0.30, 0.10, 0.30, 0.10, 0.10, 0.10],
                  [0.05, 0.45, 0.20, 0.10, 0.10, 0.10]])
REQUESTS = 60_000


def draw_proposals(q: torch.Tensor | None) -> torch.Tensor:
    """[REQUESTS, 2] proposals: drawn from Q per request, or always token 2 (a point mass) when q is None."""
    if q is None:
        return torch.full((REQUESTS, 2), 2)
    seeds = torch.arange(REQUESTS)
    return torch.stack([sample_from(q[j].expand(REQUESTS, VOCAB),
                                    counter_uniform(seeds, torch.full((REQUESTS,), j), STREAM_DRAFT))
                        for j in range(2)], dim=1)


@pytest.mark.parametrize("q", [Q, None], ids=["draft-distribution", "point-mass"])
def test_accepted_and_resampled_tokens_follow_the_target_distribution(q):
    proposals = draw_proposals(q)
    logits = P.log().repeat(REQUESTS, 1)                      # rows: p_0, p_1, p_2 for every request
    probs = None if q is None else [q] * REQUESTS
    result = verify(logits, proposals.tolist(), settings_for(REQUESTS, 1.0), probs)
    accepted = torch.tensor(result.num_accepted)
    assert 0 < accepted.float().mean() < 2
    for position in range(3):
        reached = [tokens[position] for tokens, a in zip(result.tokens, accepted.tolist(), strict=True)
                   if a >= position]
        counts = torch.bincount(torch.tensor(reached), minlength=VOCAB).double()
        assert chi_square_p_value(counts, P[position].double()) > 1e-4, f"position {position}"


def test_seeds_make_verification_reproducible_and_independent_of_the_batch():
    logits = P.log()
    alone = verify(logits, [[3, 0]], settings_for(1, 1.0, seeds=[42], positions=[7]), [Q])
    batch_logits = torch.cat([P.log()[:1], logits])
    batched = verify(batch_logits, [[], [3, 0]], settings_for(2, 1.0, seeds=[5, 42], positions=[0, 7]), [None, Q])
    assert batched.tokens[1] == alone.tokens[0]


# ---- prompt lookup --------------------------------------------------------------------------------


def test_ngram_index_proposes_what_followed_the_latest_longest_match():
    index = NgramIndex(min_n=2, max_n=3)
    tokens = [1, 2, 3, 9, 1, 2, 3, 4, 5, 7, 2, 3]
    index.extend(tokens)
    assert index.lookup(tokens, 3) == [4, 5, 7]          # (2, 3) last seen before 4 5 7
    tokens = tokens + [4]
    index.extend(tokens)
    assert index.lookup(tokens, 2) == [5, 7]              # the 3-gram (2, 3, 4) wins over (3, 4)
    assert index.lookup([8, 8, 6], 2) == []               # no earlier occurrence, and no match on itself


# ---- the scheduler's bookkeeping ------------------------------------------------------------------


def make_request(prompt: list[int], max_tokens: int = 50, temperature: float = 0.0) -> Request:
    return Request(prompt, SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=True),
                   frozenset(), 256, IncrementalDetokenizer(None, prompt), seed=1)


def test_only_accepted_speculative_tokens_count_as_computed_and_reach_the_prefix_cache():
    manager = BlockManager(num_blocks=16, block_size=4, prefix_caching=True)
    scheduler = Scheduler(manager, "continuous", 4, 64)
    request = make_request([10, 11, 12, 13, 14, 15])
    scheduler.add(request)
    prefill = scheduler.schedule()
    request.append_tokens([20], 0.0)
    scheduler.complete_step(prefill)
    assert request.num_computed_tokens == 6
    request.spec_token_ids = [21, 22, 23]
    step = scheduler.schedule()
    assert step[0].speculative_token_ids == [21, 22, 23] and step[0].num_logits == 4
    request.append_tokens([21, 30], 0.0)                  # 21 accepted, 22 rejected, 30 from the target
    scheduler.complete_step(step)
    assert request.num_computed_tokens == 8               # ... 20 21 have K/V; 30 is new; 22's slot is stale
    assert manager.num_hashed[request.request_id] == 2    # blocks [10..13] and [14 15 20 21]
    other = make_request([10, 11, 12, 13, 14, 15, 20, 22, 1])
    assert manager._cached_prefix(other.all_token_ids) == manager.block_table(request.request_id)[:1]


def test_speculative_tokens_fit_the_token_budget():
    scheduler = Scheduler(BlockManager(num_blocks=16, block_size=4, prefix_caching=False), "continuous", 4, 3)
    request = make_request([1, 2])
    scheduler.add(request)
    step = scheduler.schedule()
    request.append_tokens([3], 0.0)
    scheduler.complete_step(step)
    request.spec_token_ids = [4, 5, 6, 7]
    step = scheduler.schedule()
    assert step[0].num_new_tokens + len(step[0].speculative_token_ids) == 3
    assert step[0].speculative_token_ids == [4, 5]


def test_speculative_tokens_never_preempt():
    manager = BlockManager(num_blocks=3, block_size=4, prefix_caching=False)
    scheduler = Scheduler(manager, "continuous", 4, 64)
    first, second = make_request([1, 2, 3]), make_request([4, 5, 6])
    for request in (first, second):
        scheduler.add(request)
    step = scheduler.schedule()
    for item, token in zip(step, (7, 8), strict=True):
        item.request.append_tokens([token], 0.0)
    scheduler.complete_step(step)
    first.spec_token_ids = [1, 2, 3, 4, 5, 6]
    second.spec_token_ids = [9]
    step = scheduler.schedule()
    # first may use its own block's free slot only (the one free block is kept for the second request)
    assert [len(item.speculative_token_ids) for item in step] == [0, 1]
    assert scheduler.num_preemptions == 0
    assert first.spec_token_ids == [] and second.spec_token_ids == []


def test_the_draft_bounds_what_reaches_the_prefix_cache():
    manager = BlockManager(num_blocks=16, block_size=4, prefix_caching=True)
    scheduler = Scheduler(manager, "continuous", 4, 64, mirrors_draft_kv=True)
    request = make_request(list(range(10, 19)))
    scheduler.add(request)
    step = scheduler.schedule()
    request.append_tokens([30], 0.0)
    scheduler.complete_step(step)
    assert request.num_computed_tokens == 9 and manager.num_hashed[request.request_id] == 0
    request.draft_num_computed_tokens = 10                # the draft caught up before the next step
    step = scheduler.schedule()
    request.append_tokens([31], 0.0)
    scheduler.complete_step(step)
    assert manager.num_hashed[request.request_id] == 2


# ---- statistics of a constructed case --------------------------------------------------------------


class FixedProposer:
    def __init__(self, proposals):
        self.proposals = proposals
        self.rolled_back = {}

    def propose(self, requests, lengths):
        proposals = [self.proposals[r.request_id][:n] for r, n in zip(requests, lengths, strict=True)]
        return proposals, [None] * len(requests)

    def rollback(self, request, num_accepted):
        self.rolled_back[request.request_id] = num_accepted

    def release(self, request):
        pass

    def close(self):
        pass


def test_statistics_of_a_constructed_case():
    first, second = make_request([1, 2]), make_request([3, 4])
    for request in (first, second):
        request.num_computed_tokens = 1                   # ready to decode: one token without K/V
    proposer = FixedProposer({first.request_id: [5, 1, 3], second.request_id: [2]})
    speculator = Speculator(proposer, num_speculative_tokens=3, max_model_len=256)
    speculator.propose([first, second])
    assert first.spec_token_ids == [5, 1, 3] and second.spec_token_ids == [2]
    scheduled = [ScheduledRequest(r, 1, [0], True, r.spec_token_ids) for r in (first, second)]
    logits = peaked_logits([5, 1, 4, 0] + [3, 3])          # first: 2 of 3 accepted; second: 0 of 1
    result = speculator.verify(scheduled, logits)
    assert result.tokens == [[5, 1, 4], [3]]
    stats = speculator.stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (2, 4, 2)
    assert stats.accepted_per_position == [1, 1, 0]
    assert stats.acceptance_rate == 0.5 and stats.mean_accepted_tokens == 1.0
    assert stats.acceptance_by_position == [0.5, 0.5, 0.0]
    assert (first.spec_proposed, first.spec_accepted, first.spec_drafts) == (3, 2, 1)
    assert (second.spec_proposed, second.spec_accepted, second.spec_drafts) == (1, 0, 1)
    assert proposer.rolled_back == {first.request_id: 2, second.request_id: 0}
    first.append_tokens(result.tokens[0], 0.0)
    metrics = first.metrics()
    assert (metrics.spec_proposed, metrics.spec_accepted, metrics.spec_drafts) == (3, 2, 1)


def test_proposal_length_respects_max_tokens_and_context():
    speculator = Speculator(FixedProposer({}), num_speculative_tokens=4, max_model_len=10)
    near_limit = make_request(list(range(7)), max_tokens=50)
    near_limit.num_computed_tokens = 6
    last_tokens = make_request([1, 2], max_tokens=3)
    last_tokens.num_computed_tokens = 1
    mid_prompt = make_request([1, 2, 3])
    assert speculator.proposal_length(near_limit) == 2     # positions 7, 8 proposed, 9 from the target
    assert speculator.proposal_length(last_tokens) == 2    # 3 new tokens at most: 2 proposed + 1
    assert speculator.proposal_length(mid_prompt) == 0
