"""Scheduler bookkeeping that token equality cannot see: speculative tokens and the prefix cache."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine import SamplingParams
from engine.core.block_manager import BlockManager
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from tests.support.block_invariants import check_invariants

BLOCK = 4


def make_request(prompt: list[int]) -> Request:
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    return Request(prompt, params, frozenset(), 1000, IncrementalDetokenizer(None, prompt), seed=0)


def test_only_accepted_speculative_tokens_count_as_computed_and_get_hashed():
    manager = BlockManager(16, BLOCK, prefix_caching=True)
    scheduler = Scheduler(manager, "continuous", max_num_seqs=4, max_num_batched_tokens=64)
    request = make_request([1, 2, 3, 4, 5, 6])
    scheduler.add(request)
    [prefill] = scheduler.schedule()
    request.append_tokens([7], now=0.0)
    scheduler.complete_step([prefill])
    assert request.num_computed_tokens == 6 and len(manager.cached) == 1  # block [1, 2, 3, 4]

    [verify] = scheduler.schedule()
    manager.grow(request.request_id, request.num_tokens + 3)
    verify.speculative_token_ids = [8, 9, 10]  # K/V for 7, 8, 9, 10 is computed this step
    assert verify.num_logits == 4
    request.append_tokens([8, 42], now=1.0)  # 8 accepted, 9 rejected: the target's own token is 42
    scheduler.complete_step([verify])
    assert request.all_token_ids == [1, 2, 3, 4, 5, 6, 7, 8, 42]
    assert request.num_computed_tokens == 8, "K/V of the rejected 9 and 10 does not count"
    hashed_blocks = {manager.blocks[b].token_ids for b in manager.cached.values()}
    assert hashed_blocks == {(1, 2, 3, 4), (5, 6, 7, 8)}, "only accepted tokens are published"


def test_static_batch_admits_nothing_until_it_is_empty():
    manager = BlockManager(64, BLOCK, prefix_caching=False)
    scheduler = Scheduler(manager, "static", max_num_seqs=4, max_num_batched_tokens=64)
    first = make_request([1, 2, 3])
    scheduler.add(first)
    assert [item.request for item in scheduler.schedule()] == [first]
    late = make_request([4, 5, 6])
    scheduler.add(late)
    assert [item.request for item in scheduler.schedule()] == [first]
    scheduler.remove(first)
    assert [item.request for item in scheduler.schedule()] == [late]


def test_token_budget_splits_a_long_prompt_into_chunks():
    manager = BlockManager(64, BLOCK, prefix_caching=False)
    scheduler = Scheduler(manager, "continuous", max_num_seqs=4, max_num_batched_tokens=8)
    request = make_request(list(range(1, 21)))
    scheduler.add(request)
    sizes = []
    while not sizes or sizes[-1] == 8:
        [item] = scheduler.schedule()
        sizes.append(item.num_new_tokens)
        if item.num_logits:
            request.append_tokens([99], now=0.0)
        scheduler.complete_step([item])
    assert sizes == [8, 8, 4]


# ---- long random lives: submit / step / cancel / finish, with preemption forced by a small pool ----------------

def check_scheduler(scheduler: Scheduler, live: set) -> None:
    manager = scheduler.block_manager
    check_invariants(manager)
    running, waiting = set(scheduler.running), set(scheduler.waiting)
    assert not running & waiting, "a request is both running and waiting"
    assert running | waiting == live, "a live request was lost, or a finished one kept"
    assert {r.request_id for r in running} == set(manager.tables), "block tables belong to running requests"
    assert len(running) <= scheduler.max_num_seqs
    for request in running:
        table = manager.tables[request.request_id]
        assert len(table) * BLOCK >= request.num_computed_tokens, "computed K/V without blocks to hold it"
    for request in waiting:
        assert request.request_id not in manager.tables, "a waiting request still holds blocks"


lives = st.lists(st.tuples(st.sampled_from(["submit", "step", "step", "step", "cancel"]),
                           st.integers(1, 24), st.integers(0, 3)), min_size=20, max_size=120)


@settings(max_examples=150, deadline=None)
@given(lives, st.sampled_from(["continuous", "static"]), st.booleans(), st.integers(8, 20), st.integers(1, 4),
       st.integers(4, 32))
def test_random_lives_keep_every_invariant(ops, batching, prefix_caching, num_blocks, max_seqs, budget):
    manager = BlockManager(num_blocks, BLOCK, prefix_caching)
    scheduler = Scheduler(manager, batching, max_num_seqs=max_seqs, max_num_batched_tokens=budget)
    live: set = set()
    for op, length, pick in ops:
        max_tokens = 1 + (3 * length) % 29  # long enough that running requests outgrow the pool and get preempted
        if op == "submit" and length + max_tokens <= num_blocks * BLOCK:
            request = make_request([pick + 1] * length)
            request.params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
            scheduler.add(request)
            live.add(request)
        elif op == "cancel" and live:
            victim = sorted(live, key=lambda r: r.request_id)[pick % len(live)]
            scheduler.remove(victim)
            live.discard(victim)
        elif op == "step":
            scheduled = scheduler.schedule()
            for item in scheduled:
                if item.num_logits:
                    item.request.append_tokens([pick + 1], now=0.0)
            scheduler.complete_step(scheduled)
            for item in scheduled:
                if item.request.finished:
                    scheduler.remove(item.request)
                    live.discard(item.request)
        check_scheduler(scheduler, live)
    for request in list(live):
        scheduler.remove(request)
    assert manager.num_free_blocks == num_blocks, "blocks leaked once every request ended"
