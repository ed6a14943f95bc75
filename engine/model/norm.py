"""RMSNorm, computed as transformers computes it, so float32 outputs match token for token.

With the engine's CPU kernels (`fused`), the norm (and a residual sum followed by a norm) is one
pass of a kernel instead of six eager operations; otherwise the same arithmetic in PyTorch.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.model import cpu_kernels


class RMSNorm(nn.Module):
    """Normalise in float32, then scale in the model dtype."""

    shard_ids = (None,)

    def __init__(self, size: int, eps: float, dtype: torch.dtype, device, fused: bool = False):
        super().__init__()
        self.fused = fused
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.weight.shard_ids = self.shard_ids
        self.eps = eps

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        if param.shape != loaded.shape:
            raise ValueError(f"shape {tuple(loaded.shape)} does not fit the norm's {tuple(param.shape)}")
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return cpu_kernels.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): a residual connection and the norm after it."""
        if self.fused:
            return cpu_kernels.add_rms_norm(x, residual, self.weight, self.eps)
        total = residual + x
        return self.forward(total), total
