"""How the KV pool stores one (KV head, slot) row at each `kv_cache_dtype`, and the pure-PyTorch write and read of it.

Why one module: the pool's allocation (runner/kv_cache.py), its sizing (the plan, the memory estimate) and every
torch attention path must agree on the row format, and the C++ kernels (csrc/cpu_kernels.cpp, `store_kv` and
`paged_attention`) write and read the same bytes. A float32, bfloat16 or float16 pool holds head_dim values of that
type per row. An int8 pool (`torch.int8` here) holds head_dim int8 values followed by their float32 scale's 4 bytes
(symmetric, one scale per token and head: scale = max|x| / 127, q = round(x / scale)), so a row of 64 values is 68
bytes instead of 256 and the scale arrives in the same cache lines as the values it scales.
"""

from __future__ import annotations

import torch

SCALE_BYTES = 4  # the float32 scale after an int8 row's values
INT8_MAX = 127


def row_width(head_dim: int, kv_dtype: torch.dtype) -> int:
    """Elements of `kv_dtype` one (KV head, slot) row of the pool takes: the cache tensor's last dimension."""
    return head_dim + SCALE_BYTES if kv_dtype == torch.int8 else head_dim


def row_bytes(head_dim: int, kv_dtype: torch.dtype) -> int:
    return row_width(head_dim, kv_dtype) * torch.empty((), dtype=kv_dtype).element_size()


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """[..., D] values -> [..., D + 4] int8 rows: round(x / scale) then the float32 scale's bytes (0 for a zero row)."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True) / INT8_MAX
    values = torch.round(x / torch.where(scale == 0, 1.0, scale)).to(torch.int8)
    return torch.cat([values, scale.view(torch.int8)], dim=-1)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., D + 4] int8 rows -> [..., D] values * scale, in `dtype`."""
    head_dim = rows.shape[-1] - SCALE_BYTES
    scale = rows[..., head_dim:].contiguous().view(torch.float32)
    return (rows[..., :head_dim].float() * scale).to(dtype)


def to_cache(x: torch.Tensor, kv_dtype: torch.dtype) -> torch.Tensor:
    """K or V rows [..., D] as the pool stores them (quantized, or cast to the pool's type)."""
    return quantize_rows(x) if kv_dtype == torch.int8 else x.to(kv_dtype)


def from_cache(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows read from the pool as attention values of `dtype` (dequantized, or cast)."""
    return dequantize_rows(rows, dtype) if rows.dtype == torch.int8 else rows.to(dtype)


def as_stored(x: torch.Tensor, kv_dtype: torch.dtype) -> torch.Tensor:
    """K or V as a pool of `kv_dtype` gives it back: what a prompt's first chunk attends to over its own fresh K/V,
    so that a token scores the same whether its keys come from this step or from the pool (perplexity sees the
    cache's precision)."""
    return x if kv_dtype == x.dtype else from_cache(to_cache(x, kv_dtype), x.dtype)
