"""Attention backends over the KV cache.

Caches hold one K and one V tensor per layer, indexed by slot = block_id * block_size + offset:
head-major [num_kv_heads, num_slots, head_dim] for the torch backends, slot-major
[num_slots, num_kv_heads, head_dim] for flash-attn (see kv_cache.py).
A step's batch is flat (all sequences' new tokens concatenated), and `AttentionMetadata`, built
once per step by the runner, says where each token's K/V goes and which slots each sequence
reads. Sequences with one new token (decode) are attended together in one padded batch;
sequences with several (prefill chunks) one at a time, so short decodes never pay for a long
prompt's padding.

Backends: `sdpa` (torch's fused scaled_dot_product_attention, CPU and GPU), `eager` (plain
matmul + softmax in float32: the readable reference), `flash-attn` (varlen and paged kernels of
the flash_attn package, CUDA only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PrefillSpan:
    """One sequence with several new tokens in this step. `kv_blocks` is None when it has no past."""

    token_start: int
    token_end: int
    kv_len: int
    kv_blocks: torch.Tensor | None
    mask: torch.Tensor | None


@dataclass
class AttentionMetadata:
    """Where this step's tokens write K/V and what each sequence attends to.

    Reads go by whole blocks (`index_select` over [num_blocks, block_size, ...]): copying
    block-sized runs is an order of magnitude faster than gathering slot by slot.
    """

    slot_mapping: torch.Tensor
    decode_token_index: torch.Tensor | None = None
    decode_blocks: torch.Tensor | None = None
    decode_mask: torch.Tensor | None = None
    prefills: list[PrefillSpan] = field(default_factory=list)
    flash: dict | None = None


def causal_mask_with_offset(query_len: int, kv_len: int, device) -> torch.Tensor:
    """[query_len, kv_len] bool mask: query i (absolute position kv_len - query_len + i) sees keys <= itself."""
    query_positions = torch.arange(kv_len - query_len, kv_len, device=device)[:, None]
    return torch.arange(kv_len, device=device)[None, :] <= query_positions


def sdpa_kernel(q, k, v, mask, scale, causal):
    """q [B, Hq, L, D], k/v [B, Hkv, S, D]; mask [B or 1, 1, L, S] bool or None."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                          scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def eager_kernel(q, k, v, mask, scale, causal):
    """The textbook computation, in float32: the reference the fused kernels are checked against."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1).float()
    v = v.repeat_interleave(groups, dim=1).float()
    scores = torch.matmul(q.float(), k.transpose(-1, -2)) * scale
    if mask is None and causal:
        mask = causal_mask_with_offset(q.shape[2], k.shape[2], q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v).to(q.dtype)


class PagedAttention:
    """Writes the step's K/V into a head-major cache, then attends with a kernel (sdpa or eager)."""

    def __init__(self, kernel, head_dim: int, block_size: int):
        self.kernel = kernel
        self.scale = 1.0 / math.sqrt(head_dim)
        self.block_size = block_size

    def _blocks(self, cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
        """[H, len(block_ids) * block_size, D]: the listed blocks of every head, in order."""
        heads, _, dim = cache.shape
        paged = cache.view(heads, -1, self.block_size, dim)
        return paged.index_select(1, block_ids).view(heads, -1, dim)

    def __call__(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        k_cache.index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
        v_cache.index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
        out = torch.empty_like(q)
        if meta.decode_token_index is not None:
            batch = meta.decode_token_index.shape[0]
            q_dec = q.index_select(0, meta.decode_token_index).unsqueeze(2)           # [B, Hq, 1, D]
            k_dec = self._blocks(k_cache, meta.decode_blocks).unflatten(1, (batch, -1)).transpose(0, 1)
            v_dec = self._blocks(v_cache, meta.decode_blocks).unflatten(1, (batch, -1)).transpose(0, 1)
            attended = self.kernel(q_dec, k_dec, v_dec, meta.decode_mask, self.scale, False)
            out.index_copy_(0, meta.decode_token_index, attended.squeeze(2))
        for span in meta.prefills:
            q_span = q[span.token_start:span.token_end].transpose(0, 1).unsqueeze(0)  # [1, Hq, L, D]
            if span.kv_blocks is None:
                k_span = k[span.token_start:span.token_end].transpose(0, 1)
                v_span = v[span.token_start:span.token_end].transpose(0, 1)
            else:
                k_span = self._blocks(k_cache, span.kv_blocks)[:, :span.kv_len]
                v_span = self._blocks(v_cache, span.kv_blocks)[:, :span.kv_len]
            attended = self.kernel(q_span, k_span.unsqueeze(0), v_span.unsqueeze(0), span.mask, self.scale, True)
            out[span.token_start:span.token_end] = attended.squeeze(0).transpose(0, 1)
        return out


class FlashAttention:
    """flash_attn's kernels over the paged cache (CUDA only; block_size must be a multiple of 256).

    Prefill and mixed steps use `flash_attn_varlen_func` with the block table; pure decode steps
    use `flash_attn_with_kvcache`, whose static shapes let the runner capture them in CUDA graphs.
    """

    def __init__(self, head_dim: int, block_size: int):
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

        self.varlen = flash_attn_varlen_func
        self.with_kvcache = flash_attn_with_kvcache
        self.scale = 1.0 / math.sqrt(head_dim)
        self.block_size = block_size

    def __call__(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        k_cache.index_copy_(0, meta.slot_mapping, k)
        v_cache.index_copy_(0, meta.slot_mapping, v)
        paged_k = k_cache.view(-1, self.block_size, *k_cache.shape[1:])
        paged_v = v_cache.view(-1, self.block_size, *v_cache.shape[1:])
        flash = meta.flash
        if flash["decode_only"]:
            out = self.with_kvcache(q.unsqueeze(1), paged_k, paged_v, cache_seqlens=flash["seqlens_k"],
                                    block_table=flash["block_table"], softmax_scale=self.scale, causal=True)
            return out.squeeze(1)
        return self.varlen(q, paged_k, paged_v, cu_seqlens_q=flash["cu_seqlens_q"],
                           cu_seqlens_k=flash["cu_seqlens_k"], max_seqlen_q=flash["max_seqlen_q"],
                           max_seqlen_k=flash["max_seqlen_k"], softmax_scale=self.scale, causal=True,
                           block_table=flash["block_table"])


def make_attention(name: str, head_dim: int, block_size: int):
    if name == "flash-attn":
        return FlashAttention(head_dim, block_size)
    return PagedAttention(eager_kernel if name == "eager" else sdpa_kernel, head_dim, block_size)
