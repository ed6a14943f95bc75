"""Rotary position embeddings: cos/sin tables computed exactly as transformers computes them."""

from __future__ import annotations

import torch

from engine.model import cpu_kernels


def rope_cos_sin(hf_config, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [max_positions, head_dim] for the checkpoint's RoPE variant (scaled ones too)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = hf_config.rope_parameters.get("rope_type", "default")
    if rope_type == "default":
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        base = hf_config.rope_parameters["rope_theta"]
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        scaling = 1.0
    elif rope_type == "dynamic":
        raise ValueError("dynamic NTK RoPE rescales with the sequence length and is not supported natively")
    else:
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"))
    freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos() * scaling, angles.sin() * scaling


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate [tokens, heads, head_dim] by each token's position (cos/sin [tokens, 1, head_dim])."""
    return x * cos + rotate_half(x) * sin


def rotate_queries_and_keys(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                            fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated by their tokens' positions: `fused`, in place by one call of the engine's CPU
    kernel (q and k are views of the fused QKV output, which nothing else reads); else in PyTorch."""
    if fused:
        cpu_kernels.rotary_(q, k, cos, sin)
        return q, k
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
