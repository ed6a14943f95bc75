"""Block manager invariants under random allocate / grow / commit / free sequences."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.block_manager import BlockManager
from tests.support.block_invariants import check_invariants

BLOCK = 4


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
