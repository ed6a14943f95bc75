"""What must hold of a block manager after any sequence of operations (the block manager's and scheduler's
property tests check it after every step)."""

from __future__ import annotations

from engine.core.block_manager import BlockManager


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
