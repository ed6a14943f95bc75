"""Prefix caching (`prefix_caching`): full KV blocks of a prompt are hashed in a chain and shared.

The block manager's own rules first (sharing, collisions, eviction, a prefix still being computed),
then their effect through the engine's API (cached tokens, hit rate, prompts arriving together).
The speculative rules on what may reach the cache are in tests/engine/speculative/test_spec_rules.py.
"""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.core.block_manager import BlockManager
from tests.support.prompts import distinct_prompts

BLOCK = 4
SHORT = SamplingParams(max_tokens=4, ignore_eos=True)


def test_prefix_is_shared_and_survives_its_first_user():
    manager = BlockManager(8, BLOCK, prefix_caching=True)
    prompt = list(range(10))
    assert manager.allocate(1, prompt) == 0
    manager.commit(1, prompt, len(prompt))
    assert manager.allocate(2, prompt + [99]) == 8, "two full blocks of the shared prefix are reused"
    assert manager.tables[1][:2] == manager.tables[2][:2]
    manager.free(1)
    manager.free(2)
    assert manager.allocate(3, prompt) == 8, "freed blocks stay cached until reallocated"


def test_hash_collision_is_caught_by_the_token_check(monkeypatch):
    manager = BlockManager(8, BLOCK, prefix_caching=True)
    monkeypatch.setattr(BlockManager, "chain_hash", staticmethod(lambda parent, tokens: 42))
    first = [1, 2, 3, 4, 5]
    manager.allocate(1, first)
    manager.commit(1, first, 5)
    assert manager.allocate(2, [9, 9, 9, 9, 9]) == 0, "a colliding hash with other tokens is not a hit"


def test_cached_blocks_are_evicted_when_the_pool_needs_them():
    manager = BlockManager(3, BLOCK, prefix_caching=True)
    prompt = list(range(9))
    manager.allocate(1, prompt)
    manager.commit(1, prompt, 9)
    manager.free(1)
    assert manager.allocate(2, [50] * 12) == 0
    assert not manager.cached, "reallocated blocks drop their stale hashes"


def test_a_prefix_being_computed_is_pending_until_committed():
    manager = BlockManager(16, BLOCK, prefix_caching=True)
    prompt = list(range(13))
    manager.allocate(1, prompt)
    assert manager.waits_for_pending(prompt[:12] + [77, 78])
    assert not manager.waits_for_pending([50] * 13), "an unrelated prompt does not wait"
    manager.commit(1, prompt, 13)
    assert not manager.waits_for_pending(prompt[:12] + [77, 78])
    assert manager.allocate(2, prompt[:12] + [77, 78]) == 12


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prefix_caching_reuses_a_shared_prefix_only_when_on(tiny_llama_dir, prefix_caching):
    prefix = distinct_prompts(1, 64)[0]
    with Engine(EngineConfig(model=tiny_llama_dir, block_size=16, prefix_caching=prefix_caching)) as engine:
        first = engine.generate(prefix + [5], SHORT)[0]
        second = engine.generate(prefix + [6], SHORT)[0]
        third = engine.generate(prefix[:40] + [7], SHORT)[0]
        hit_rate = engine.stats().prefix_cache_hit_rate
    assert first.metrics.cached_tokens == 0
    if prefix_caching:
        assert (second.metrics.cached_tokens, third.metrics.cached_tokens) == (64, 32), "whole blocks only"
        assert hit_rate > 0
    else:
        assert (second.metrics.cached_tokens, third.metrics.cached_tokens) == (0, 0)
        assert hit_rate == 0.0


def test_prefix_cache_hits_on_a_shared_prompt(tiny_llama_dir):
    prefix = list(range(10, 74))
    with Engine(EngineConfig(model=tiny_llama_dir, block_size=16, prefix_caching=True)) as engine:
        first = engine.generate(prefix + [1], SamplingParams(max_tokens=4, ignore_eos=True))[0]
        second = engine.generate(prefix + [2], SamplingParams(max_tokens=4, ignore_eos=True))[0]
        assert first.metrics.cached_tokens == 0
        assert second.metrics.cached_tokens == 64
        assert engine.stats().prefix_cache_hit_rate > 0.4


def test_requests_arriving_together_share_a_prefix_computed_once(tiny_llama_dir):
    """The second prompt waits one step for the first to compute the shared blocks, then reuses them."""
    prefix = list(range(10, 74))
    with Engine(EngineConfig(model=tiny_llama_dir, block_size=16, prefix_caching=True)) as engine:
        outputs = engine.generate([prefix + [1], prefix + [2], prefix + [3]],
                                  SamplingParams(max_tokens=4, ignore_eos=True))
    assert [o.metrics.cached_tokens for o in outputs] == [0, 64, 64]
