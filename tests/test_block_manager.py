"""Block manager invariants under random allocate / grow / commit / free sequences."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.block_manager import BlockManager

BLOCK = 4


def check_invariants(manager: BlockManager) -> None:
    expected_refs = [0] * manager.num_blocks
    for table in manager.tables.values():
        assert len(set(table)) == len(table), "a sequence holds the same block twice"
        for block_id in table:
            expected_refs[block_id] += 1
    for block in manager.blocks:
        assert block.ref_count == expected_refs[block.block_id], "ref count disagrees with the block tables"
        assert manager.is_free(block.block_id) == (block.ref_count == 0), "free lists disagree with refs"
    for block_hash, block_id in manager.cached.items():
        assert manager.blocks[block_id].block_hash == block_hash
    assert set(manager.pending.values()) <= set(manager.tables), "a pending prefix block outlived its sequence"


operations = st.lists(st.tuples(st.sampled_from(["allocate", "grow", "commit", "free"]),
                                st.integers(0, 5), st.integers(1, 30), st.integers(0, 2)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(operations, st.booleans(), st.integers(4, 24))
def test_random_operations_keep_invariants(ops, prefix_caching, num_blocks):
    manager = BlockManager(num_blocks, BLOCK, prefix_caching)
    tokens: dict[int, list[int]] = {}
    for op, seq, length, alphabet in ops:
        if op == "allocate" and seq not in tokens:
            prompt = [alphabet] * length
            if manager.can_allocate(prompt):
                cached = manager.allocate(seq, prompt)
                assert cached % BLOCK == 0 and cached < length
                tokens[seq] = prompt
        elif op == "grow" and seq in tokens:
            target = len(tokens[seq]) + length
            if manager.can_grow(seq, target):
                manager.grow(seq, target)
                tokens[seq] = tokens[seq] + [alphabet] * length
        elif op == "commit" and seq in tokens:
            manager.commit(seq, tokens[seq], len(tokens[seq]))
        elif op == "free" and seq in tokens:
            manager.free(seq)
            del tokens[seq]
        check_invariants(manager)
    for seq in list(tokens):
        manager.free(seq)
    check_invariants(manager)
    assert manager.num_free_blocks == num_blocks, "blocks leaked after every sequence finished"


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


def test_freed_blocks_nobody_can_find_are_reused_before_never_used_ones():
    """Their pages are committed already; a never-used block's first write faults its pages in. Cached blocks still
    go last, least recently freed first."""
    manager = BlockManager(16, BLOCK, prefix_caching=False)
    manager.allocate(1, list(range(10)))
    first = list(manager.tables[1])
    manager.free(1)
    manager.allocate(2, list(range(50, 60)))
    assert manager.tables[2] == first, "the freed blocks come back, not blocks 3, 4, 5"
    cached = BlockManager(16, BLOCK, prefix_caching=True)
    prompt = list(range(10))
    cached.allocate(1, prompt)
    cached.commit(1, prompt, len(prompt))
    full, partial = cached.tables[1][:2], cached.tables[1][2]
    cached.free(1)
    cached.allocate(2, [70] * 5)
    assert cached.tables[2][0] == partial, "the partial block holds nothing findable: reused first"
    assert not set(cached.tables[2]) & set(full), "the cached prefix survives while never-used blocks remain"
    assert cached.allocate(3, prompt) == 8
