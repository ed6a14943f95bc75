"""The KV pool: one preallocated K and V tensor per layer, carved into blocks of `block_size` slots.

The pool is sized once from `kv_cache_bytes`; blocks are handed out by the BlockManager. It is
zero-filled because padded attention reads masked slots, and 0 * NaN garbage would leak NaN.
"""

from __future__ import annotations

import torch

from engine.model import ModelSpec


def bytes_per_block(spec: ModelSpec, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * spec.num_layers * block_size * spec.num_kv_heads * spec.head_dim * element


class KVCache:
    """Per-layer K/V tensors of shape [num_blocks * block_size, num_kv_heads, head_dim]."""

    def __init__(self, spec: ModelSpec, num_blocks: int, block_size: int, dtype: torch.dtype, device: str):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.block_bytes = bytes_per_block(spec, block_size, dtype)
        shape = (2, spec.num_layers, num_blocks * block_size, spec.num_kv_heads, spec.head_dim)
        self.storage = torch.zeros(shape, dtype=dtype, device=device)
        self.layers = [(self.storage[0, layer], self.storage[1, layer]) for layer in range(spec.num_layers)]

    @property
    def nbytes(self) -> int:
        return self.storage.untyped_storage().nbytes()

