"""The KV pool: one preallocated K and V tensor per layer, carved into blocks of `block_size` slots.

The pool is sized once from `kv_cache_bytes`; blocks are handed out by the BlockManager. It is
not zero-filled: no attention backend reads a slot before it was written (the paged kernels stop at
each sequence's length; the padded PyTorch path zeroes what it copied past it), so the operating
system commits the pool's pages only as blocks are first written, and memory follows the work. The
pool keeps 4 KiB pages: with 2 MiB pages (model/huge_pages.py) attention over a warm pool was 1.3x
faster, but each first write into a 2 MiB region stalled on the kernel zeroing (and compacting for)
it: a fresh batch-64 run of random-llama-20m lost more in KV writes (1.3 ms a step) than attention
gained (0.6 ms).

Two layouts of the same slots: slot-major [slots, kv_heads, head_dim] is what flash-attn's paged
kernels read; head-major [kv_heads, slots, head_dim] lets the torch backends gather a sequence's
blocks straight into the [heads, length, head_dim] shape attention wants, with no transpose copy.

The pool's element type is the plan's `kv_dtype` (the model's dtype unless `kv_cache_dtype` says otherwise); an int8
pool's rows carry their scale inline, so its last dimension is head_dim + 4 (model/kv_format.py).
"""

from __future__ import annotations

import torch

from engine.model.kv_format import row_bytes, row_width
from engine.model.spec import ModelSpec


def bytes_per_block(spec: ModelSpec, block_size: int, kv_dtype: torch.dtype) -> int:
    return 2 * spec.num_layers * block_size * spec.num_kv_heads * row_bytes(spec.head_dim, kv_dtype)


class KVCache:
    """Per-layer K and V tensors over `num_blocks * block_size` slots, slot-major or head-major."""

    def __init__(self, spec: ModelSpec, num_blocks: int, block_size: int, kv_dtype: torch.dtype, device: str,
                 head_major: bool):
        self.block_size = block_size
        self.block_bytes = bytes_per_block(spec, block_size, kv_dtype)
        slots = num_blocks * block_size
        per_layer = (spec.num_kv_heads, slots) if head_major else (slots, spec.num_kv_heads)
        self.storage = torch.empty((2, spec.num_layers, *per_layer, row_width(spec.head_dim, kv_dtype)),
                                   dtype=kv_dtype, device=device)
        self.layers = [(self.storage[0, layer], self.storage[1, layer]) for layer in range(spec.num_layers)]

    @property
    def nbytes(self) -> int:
        return self.storage.untyped_storage().nbytes()

