"""Attention backends over the KV cache.

Caches hold one K and one V tensor per layer, indexed by slot = block_id * block_size + offset:
head-major [num_kv_heads, num_slots, head_dim] for the CPU/torch backends, slot-major
[num_slots, num_kv_heads, head_dim] for flash-attn (see runner/kv_cache.py). A step's batch is
flat (all sequences' new tokens concatenated); the runner describes it once per step as a
`StepBatch`, and each backend turns that into the `AttentionMetadata` its layers read.

Backends:
- `cpu-kernel`: the engine's C++ kernel (model/cpu_kernels.py) reads each sequence's K/V blocks in
  place through its block table, for decode tokens and for short chunks over a cached prefix
  (speculative verification, chunked prefill tails); a prompt's first chunk attends to its own
  fresh K/V with torch's SDPA, as do long chunks over a prefix (whose gather is then amortised).
- `sdpa`, `eager`: pure PyTorch. Decode tokens and short chunks (speculative verification, a draft's
  catch-up) are attended together after copying every cached block of their sequences into one
  padded tensor, their queries padded to the longest chunk (torch's fused SDPA, or matmul + softmax
  in float32: the readable reference); the step's longer chunks (prompts) form a second padded batch
  when its mask stays small, else go one sequence at a time. The pool is not zero-filled, so the
  padding copied with the blocks is zeroed before it is read.
- `flash-attn`: the flash_attn package's varlen and paged kernels (CUDA only).

A pool of another `kv_cache_dtype` than the model's (model/kv_format.py) is read in place by the C++ kernel; the
torch paths, on a CPU and on a GPU alike, store K/V converted (int8: quantized) and convert (dequantize) the blocks
they gather before attention: dequantize-on-gather, not a fused kernel. A prompt's first chunk attends to its own
K/V as the pool stores them (quantized and back), so every token sees the cache's precision, in prefill as in
decode. flash-attn reads the model's dtype only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.core.step_timing import section
from engine.model import cpu_kernels
from engine.model.kv_format import as_stored, from_cache, to_cache

# A chunk over a cached prefix with more query tokens than this gathers its prefix once and runs SDPA:
# the kernel reads K/V once per query row, SDPA's matmuls amortise one copy over many rows.
KERNEL_MAX_CHUNK_TOKENS = 32
# Chunks of at most this many tokens join the decode tokens' padded batch in the pure-PyTorch backends: a fixed
# number of operators per layer for the whole batch, where one span per sequence costs about ten per sequence.
GATHER_MAX_CHUNK_TOKENS = 16
# The longer chunks of a step attend as one padded batch while rows x query slots x key slots stays within this
# (a 16 MB mask; the eager reference's float32 scores per head are 4x that): prompts arriving together are then a
# fixed number of operators per layer too. Beyond it, and for a lone chunk, one span per sequence.
PADDED_MASK_BUDGET = 2**22


@dataclass
class StepBatch:
    """A step's flat batch as the runner prepared it: per-token and per-sequence tensors, plus host copies.

    Sequence n's tokens are rows `query_start[n]` .. `query_start[n] + query_len[n] - 1`, at positions
    `context_lens[n] - query_len[n]` .. `context_lens[n] - 1`, with K/V in blocks `block_tables[n]`.
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    query_start: torch.Tensor
    query_len: torch.Tensor
    context_lens: torch.Tensor
    query_lens: list[int]
    starts: list[int]

    @property
    def decode_only(self) -> bool:
        return max(self.query_lens) == 1


@dataclass
class PrefillSpan:
    """One sequence with several new tokens in this step. `kv_blocks` is None when it has no past."""

    token_start: int
    token_end: int
    kv_len: int
    kv_blocks: torch.Tensor | None
    mask: torch.Tensor | None


@dataclass
class PaddedRows:
    """Sequences attended together over padded copies of their blocks, each with its new tokens padded to the
    longest: [B, L] query slots, the first `query_len[b]` of row b real (a padding slot repeats the row's last
    token and is never written back)."""

    token_index: torch.Tensor    # [B * L] flat token row of each query slot
    real_slots: torch.Tensor     # [B * L] bool: the slot holds one of the row's tokens
    blocks: torch.Tensor         # [B * width] block ids, row-major
    kv_padding: torch.Tensor     # [B, 1, width * block_size, 1] bool: slot past this row's length (zeroed)
    mask: torch.Tensor           # [B, 1, L, width * block_size] bool: what each query slot may see (causal)
    rows: int
    query_slots: int


@dataclass
class AttentionMetadata:
    """What the layers of one step read: where K/V go (`slot_mapping`) and the backend's own view of the batch."""

    slot_mapping: torch.Tensor
    batch: StepBatch | None = None
    kernel_query_len: torch.Tensor | None = None
    padded: list[PaddedRows] = field(default_factory=list)
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


def write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Store the step's K/V [tokens, kv_heads, dim] in their slots of a head-major cache, in the cache's format."""
    k_cache.index_copy_(1, slot_mapping, to_cache(k, k_cache.dtype).transpose(0, 1))
    v_cache.index_copy_(1, slot_mapping, to_cache(v, v_cache.dtype).transpose(0, 1))


class SpanAttention:
    """Chunks with several new tokens, one sequence at a time: over their own fresh K/V (a prompt's
    first chunk), or over their blocks gathered into one contiguous copy (a chunk after a prefix)."""

    def __init__(self, kernel, head_dim: int, block_size: int):
        self.kernel = kernel
        self.scale = 1.0 / math.sqrt(head_dim)
        self.block_size = block_size

    def blocks(self, cache: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[H, len(block_ids) * block_size, D]: the listed blocks of every head, in order, as values of `dtype`."""
        heads, _, width = cache.shape
        paged = cache.view(heads, -1, self.block_size, width)
        return from_cache(paged.index_select(1, block_ids).view(heads, -1, width), dtype)

    def span(self, batch: StepBatch, row: int, token_start: int) -> PrefillSpan:
        count, start = batch.query_lens[row], batch.starts[row]
        kv_len = start + count
        if start == 0:
            return PrefillSpan(token_start, token_start + count, kv_len, None, None)
        blocks = batch.block_tables[row, :-(-kv_len // self.block_size)].long()
        return PrefillSpan(token_start, token_start + count, kv_len, blocks,
                           causal_mask_with_offset(count, kv_len, batch.block_tables.device))

    def attend_spans(self, q, k, v, k_cache, v_cache, spans: list[PrefillSpan], out) -> None:
        for span in spans:
            q_span = q[span.token_start:span.token_end].transpose(0, 1).unsqueeze(0)  # [1, Hq, L, D]
            if span.kv_blocks is None:
                k_span = as_stored(k[span.token_start:span.token_end], k_cache.dtype).transpose(0, 1)
                v_span = as_stored(v[span.token_start:span.token_end], v_cache.dtype).transpose(0, 1)
            else:
                k_span = self.blocks(k_cache, span.kv_blocks, q.dtype)[:, :span.kv_len]
                v_span = self.blocks(v_cache, span.kv_blocks, q.dtype)[:, :span.kv_len]
            attended = self.kernel(q_span, k_span.unsqueeze(0), v_span.unsqueeze(0), span.mask, self.scale, True)
            out[span.token_start:span.token_end] = attended.squeeze(0).transpose(0, 1)


def _token_starts(query_lens: list[int]) -> list[int]:
    starts, total = [], 0
    for length in query_lens:
        starts.append(total)
        total += length
    return starts


class CpuPagedAttention(SpanAttention):
    """Decode tokens and short chunks over a prefix: the C++ kernel over the pool in place; the rest: SDPA spans."""

    def __init__(self, head_dim: int, block_size: int):
        reason = cpu_kernels.unavailable_reason()
        if reason:
            raise RuntimeError(f"attention='cpu-kernel' cannot run: {reason}")
        super().__init__(sdpa_kernel, head_dim, block_size)

    def build_metadata(self, batch: StepBatch) -> AttentionMetadata:
        meta = AttentionMetadata(slot_mapping=batch.slot_mapping, batch=batch)
        if batch.decode_only:
            meta.kernel_query_len = batch.query_len
            return meta
        by_span = [length > 1 and (start == 0 or length > KERNEL_MAX_CHUNK_TOKENS)
                   for length, start in zip(batch.query_lens, batch.starts, strict=True)]
        token_starts = _token_starts(batch.query_lens)
        meta.prefills = [self.span(batch, row, token_starts[row]) for row, spanned in enumerate(by_span) if spanned]
        spanned = torch.tensor(by_span, device=batch.query_len.device)
        meta.kernel_query_len = batch.query_len.masked_fill(spanned, 0)
        return meta

    def __call__(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        with section("kv_write"):
            cpu_kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        with section("attention"):
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            batch = meta.batch
            cpu_kernels.paged_attention(q, k_cache, v_cache, batch.block_tables, batch.query_start,
                                        meta.kernel_query_len, batch.context_lens, self.block_size, self.scale, out)
            self.attend_spans(q, k, v, k_cache, v_cache, meta.prefills, out)
        return out


class GatherAttention(SpanAttention):
    """Pure PyTorch: decode tokens and short chunks attend together over their blocks copied into one padded
    tensor; longer chunks (prompts) in a second one when it stays small, else one sequence at a time."""

    def build_metadata(self, batch: StepBatch) -> AttentionMetadata:
        meta = AttentionMetadata(slot_mapping=batch.slot_mapping)
        short = [row for row, length in enumerate(batch.query_lens) if length <= GATHER_MAX_CHUNK_TOKENS]
        long = [row for row, length in enumerate(batch.query_lens) if length > GATHER_MAX_CHUNK_TOKENS]
        if short:
            meta.padded.append(self._padded_rows(batch, short))
        if len(long) > 1 and self._padded_mask_size(batch, long) <= PADDED_MASK_BUDGET:
            meta.padded.append(self._padded_rows(batch, long))
        else:
            token_starts = _token_starts(batch.query_lens)
            meta.prefills = [self.span(batch, row, token_starts[row]) for row in long]
        return meta

    def _padded_shape(self, batch: StepBatch, rows: list[int]) -> tuple[int, int]:
        """Query slots per row (the longest chunk) and blocks per row (the longest context) of a padded batch."""
        slots = max(batch.query_lens[r] for r in rows)
        return slots, -(-max(batch.starts[r] + batch.query_lens[r] for r in rows) // self.block_size)

    def _padded_mask_size(self, batch: StepBatch, rows: list[int]) -> int:
        slots, width = self._padded_shape(batch, rows)
        return len(rows) * slots * width * self.block_size

    def _padded_rows(self, batch: StepBatch, rows: list[int]) -> PaddedRows:
        device = batch.query_len.device
        slots, width = self._padded_shape(batch, rows)
        index = torch.tensor(rows, device=device)
        lens, counts = batch.context_lens.index_select(0, index), batch.query_len.index_select(0, index)
        slot = torch.arange(slots, device=device)
        real = slot[None, :] < counts[:, None]                                        # [B, L]
        clamped = torch.minimum(slot[None, :], counts[:, None] - 1)
        kv_positions = torch.arange(width * self.block_size, device=device)
        query_positions = lens[:, None] - counts[:, None] + clamped                   # [B, L]
        return PaddedRows(
            token_index=(batch.query_start.index_select(0, index)[:, None] + clamped).flatten(),
            real_slots=real.flatten(),
            blocks=batch.block_tables.index_select(0, index)[:, :width].flatten().long(),
            kv_padding=(kv_positions[None, :] >= lens[:, None])[:, None, :, None],
            mask=(kv_positions[None, None, :] <= query_positions[:, :, None]).unsqueeze(1),
            rows=len(rows), query_slots=slots)

    def _padded_cache(self, cache: torch.Tensor, padded: PaddedRows, dtype: torch.dtype) -> torch.Tensor:
        """[B, H, width, D] blocks of each padded row's sequence; slots past its length (never written, or
        stale from an earlier owner of the block) are zeroed so that no garbage reaches the softmax."""
        gathered = self.blocks(cache, padded.blocks, dtype).unflatten(1, (padded.rows, -1)).transpose(0, 1)
        return gathered.masked_fill_(padded.kv_padding, 0.0)

    def __call__(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        with section("kv_write"):
            write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        for padded in meta.padded:
            with section("kv_gather"):
                k_padded = self._padded_cache(k_cache, padded, q.dtype)
                v_padded = self._padded_cache(v_cache, padded, q.dtype)
            with section("attention"):
                q_padded = q.index_select(0, padded.token_index).unflatten(0, (padded.rows, padded.query_slots))
                attended = self.kernel(q_padded.transpose(1, 2), k_padded, v_padded, padded.mask, self.scale, False)
                attended = attended.transpose(1, 2).flatten(0, 1)                    # [B * L, Hq, D]
                if padded.query_slots == 1:
                    out.index_copy_(0, padded.token_index, attended)
                else:
                    out.index_copy_(0, padded.token_index[padded.real_slots], attended[padded.real_slots])
        with section("attention"):
            self.attend_spans(q, k, v, k_cache, v_cache, meta.prefills, out)
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

    def build_metadata(self, batch: StepBatch) -> AttentionMetadata:
        device = batch.query_len.device
        cu_q = torch.zeros(len(batch.query_lens) + 1, dtype=torch.int32, device=device)
        cu_k = torch.zeros_like(cu_q)
        cu_q[1:] = torch.cumsum(batch.query_len, 0)
        cu_k[1:] = torch.cumsum(batch.context_lens, 0)
        return AttentionMetadata(slot_mapping=batch.slot_mapping, flash={
            "decode_only": batch.decode_only, "block_table": batch.block_tables,
            "seqlens_k": batch.context_lens.to(torch.int32), "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
            "max_seqlen_q": max(batch.query_lens),
            "max_seqlen_k": max(s + n for s, n in zip(batch.starts, batch.query_lens, strict=True))})

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
    if name == "cpu-kernel":
        return CpuPagedAttention(head_dim, block_size)
    return GatherAttention(eager_kernel if name == "eager" else sdpa_kernel, head_dim, block_size)
