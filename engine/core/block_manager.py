"""Block tables, reference counts and the prefix cache over a fixed pool of KV blocks.

Pure bookkeeping (no tensors), so its invariants can be tested on their own. Each sequence owns
a block table: the ids of the blocks holding its K/V, in order. With prefix caching, every full
block is identified by a hash chained over all tokens up to its end, so two prompts that share a
prefix share its blocks (ref count > 1). A block whose last user leaves keeps its hash and stays
findable until the allocator hands it out again: free blocks are reused least-recently-freed first,
so popular prefixes survive. A stored copy of each block's tokens guards against hash collisions.
A freed block that nobody can find again (a partial last block, any block without prefix caching) is
handed out before all of those, newest first: its pages are already committed and likely still in
cache, while a never-used block's first write page-faults, and RSS would creep up to the whole pool.

`block_size = max_model_len` gives the contiguous layout: each sequence reserves one slab for its
whole context up front, which is the naive allocation paging replaces.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] | None = None


class BlockManager:
    """Allocates KV blocks to sequences; shares full blocks between sequences with equal prefixes."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool):
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.reusable_ids: list[int] = []  # freed, holding nothing findable: taken first, last freed first
        self.cached: dict[int, int] = {}
        self.tables: dict[int, list[int]] = {}
        self.num_hashed: dict[int, int] = {}
        self.pending: dict[int, int] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids) + len(self.reusable_ids)

    def is_free(self, block_id: int) -> bool:
        return block_id in self.free_ids or block_id in self.reusable_ids

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @staticmethod
    def chain_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
        return hash((parent, tokens))

    def _block_hashes(self, token_ids: list[int], start: int, stop: int, parent: int | None):
        """(index, tokens, chain hash) of full blocks start..stop-1 of `token_ids`."""
        for index in range(start, stop):
            tokens = tuple(token_ids[index * self.block_size:(index + 1) * self.block_size])
            parent = self.chain_hash(parent, tokens)
            yield index, tokens, parent

    def _lookup(self, token_ids: list[int]) -> tuple[list[int], int | None]:
        """Cached blocks matching the longest prefix of `token_ids` (leaving >= 1 token to compute),
        and the hash of the first full block after them that is not cached (None if there is none)."""
        hits: list[int] = []
        if not self.prefix_caching:
            return hits, None
        for _, tokens, block_hash in self._block_hashes(token_ids, 0, (len(token_ids) - 1) // self.block_size, None):
            block_id = self.cached.get(block_hash)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                return hits, block_hash
            hits.append(block_id)
        return hits, None

    def _cached_prefix(self, token_ids: list[int]) -> list[int]:
        return self._lookup(token_ids)[0]

    def waits_for_pending(self, token_ids: list[int]) -> bool:
        """True if the next uncached block of this prompt is being computed by a running sequence.

        Admitting such a prompt now would compute the same K/V twice; one step later it is a hit.
        """
        _, next_hash = self._lookup(token_ids)
        return next_hash is not None and next_hash in self.pending

    def can_allocate(self, token_ids: list[int]) -> bool:
        hits = self._cached_prefix(token_ids)
        reused_free = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        return self.blocks_needed(len(token_ids)) - len(hits) <= self.num_free_blocks - reused_free

    def _findable(self, block: Block) -> bool:
        """Whether a prefix lookup can still find this block (its hash maps to it)."""
        return block.block_hash is not None and self.cached.get(block.block_hash) == block.block_id

    def _take_free_block(self) -> int:
        block_id = self.reusable_ids.pop() if self.reusable_ids else self.free_ids.popitem(last=False)[0]
        block = self.blocks[block_id]
        if self._findable(block):
            del self.cached[block.block_hash]
        block.block_hash = None
        block.token_ids = None
        block.ref_count = 1
        return block_id

    def allocate(self, seq_id: int, token_ids: list[int]) -> int:
        """Give `seq_id` blocks for all of `token_ids`; return how many leading tokens are already cached."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} already has blocks")
        if not self.can_allocate(token_ids):
            raise MemoryError("not enough free KV blocks")
        hits = self._cached_prefix(token_ids)
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_ids[block_id]
            block.ref_count += 1
        table = hits + [self._take_free_block() for _ in range(self.blocks_needed(len(token_ids)) - len(hits))]
        self.tables[seq_id] = table
        self.num_hashed[seq_id] = len(hits)
        if self.prefix_caching:
            parent = self.blocks[hits[-1]].block_hash if hits else None
            for _, _, block_hash in self._block_hashes(token_ids, len(hits), len(token_ids) // self.block_size, parent):
                self.pending.setdefault(block_hash, seq_id)
        return len(hits) * self.block_size

    def allocate_uncached(self, seq_id: int, num_tokens: int) -> list[int]:
        """Fresh blocks for a sequence whose K/V is scratch (a perplexity window): no prefix lookup, and
        never hashed, so nothing it writes is ever served from the prefix cache. Release with `free`."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} already has blocks")
        if self.blocks_needed(num_tokens) > self.num_free_blocks:
            raise MemoryError("not enough free KV blocks")
        self.tables[seq_id] = [self._take_free_block() for _ in range(self.blocks_needed(num_tokens))]
        self.num_hashed[seq_id] = 0
        return self.tables[seq_id]

    def can_grow(self, seq_id: int, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) - len(self.tables[seq_id]) <= self.num_free_blocks

    def grow(self, seq_id: int, num_tokens: int) -> None:
        """Make room for `num_tokens` tokens in total."""
        table = self.tables[seq_id]
        missing = self.blocks_needed(num_tokens) - len(table)
        if missing > self.num_free_blocks:
            raise MemoryError("not enough free KV blocks")
        table.extend(self._take_free_block() for _ in range(missing))

    def commit(self, seq_id: int, token_ids: list[int], num_computed: int) -> None:
        """Register the hashes of blocks that became full of computed K/V, so later prompts can reuse them."""
        if not self.prefix_caching:
            return
        table = self.tables[seq_id]
        first = self.num_hashed[seq_id]
        full = min(num_computed // self.block_size, len(table))
        parent = self.blocks[table[first - 1]].block_hash if first else None
        for index, tokens, block_hash in self._block_hashes(token_ids, first, full, parent):
            block = self.blocks[table[index]]
            block.block_hash = block_hash
            block.token_ids = tokens
            self.cached.setdefault(block_hash, block.block_id)
            if self.pending.get(block_hash) == seq_id:
                del self.pending[block_hash]
        self.num_hashed[seq_id] = max(first, full)

    def free(self, seq_id: int) -> None:
        """Release a sequence's blocks; cached ones stay findable until reallocated."""
        for block_id in reversed(self.tables.pop(seq_id)):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if self._findable(block):
                    self.free_ids[block_id] = None
                else:
                    self.reusable_ids.append(block_id)
        self.num_hashed.pop(seq_id)
        for block_hash in [h for h, owner in self.pending.items() if owner == seq_id]:
            del self.pending[block_hash]

    def block_table(self, seq_id: int) -> list[int]:
        return self.tables[seq_id]
