"""The engine's own 8-bit and 4-bit weight formats, packed for its CPU kernels (model/csrc/quantized_linear.cpp).

Why our own: every library level (bitsandbytes, quanto, torchao) decodes slower than float32 on a
CPU, because each dequantizes its weights in memory or splits the matmul into many small calls;
decode reads every weight each step, so fewer bytes should mean a faster step. These formats are
read once per step by integer kernels (AVX-512 VNNI, AVX2, plain C++) with the activations
quantized to int8 per row on the fly:

- 8-bit: int8 weights, one float32 scale per output row (symmetric, |q| <= 127): 1 byte a weight.
- 4-bit: nibbles holding q + 8 (q in -8..7), one float32 scale per group of 32 inputs (the largest
  magnitude of a group maps to -8, as llama.cpp's Q4_0 does): 5 bits a weight.

Inputs are padded with zero weights to a multiple of the kernels' chunk: 64 for 8-bit, 128 for
4-bit. Each 128-input chunk of a 4-bit row is 64 bytes: byte j holds input j in its low nibble
and input j + 64 in its high one, so one load and two masks unpack it into 128 bytes in input
order.
"""

from __future__ import annotations

import torch
from torch import nn

CHUNK = {8: 64, 4: 128}  # inputs per chunk of each format
GROUP = 32


def padded_inputs(in_features: int, bits: int) -> int:
    return -(-in_features // CHUNK[bits]) * CHUNK[bits]


def _padded(weight: torch.Tensor, bits: int) -> torch.Tensor:
    weight = weight.detach().float()
    extra = padded_inputs(weight.shape[1], bits) - weight.shape[1]
    return torch.nn.functional.pad(weight, (0, extra)) if extra else weight


def pack_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [out, padded in], float32 scales [out]) of a float weight [out, in]."""
    weight = _padded(weight, 8)
    scales = weight.abs().amax(dim=1) / 127
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    values = torch.round(weight / safe[:, None]).clamp_(-127, 127).to(torch.int8)
    return values.contiguous(), scales.contiguous()


def pack_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 [out, padded in / 2], float32 scales [out, padded in / 32]) of a float weight [out, in]."""
    weight = _padded(weight, 4)
    out_features, inputs = weight.shape
    groups = weight.view(out_features, inputs // GROUP, GROUP)
    extreme = groups.gather(2, groups.abs().argmax(dim=2, keepdim=True)).squeeze(2)  # signed, largest magnitude
    scales = extreme / -8
    safe = torch.where(scales != 0, scales, torch.ones_like(scales))
    nibbles = (torch.round(groups / safe[..., None]).clamp_(-8, 7) + 8).to(torch.uint8)
    half = CHUNK[4] // 2
    chunks = nibbles.view(out_features, inputs // CHUNK[4], 2, half)  # per chunk: inputs 0..63, then 64..127
    packed = chunks[:, :, 0] | (chunks[:, :, 1] << 4)
    return packed.reshape(out_features, inputs // 2).contiguous(), scales.contiguous()


def unpack(packed: torch.Tensor, scales: torch.Tensor, in_features: int) -> torch.Tensor:
    """The float weight [out, in] a packed one stands for (for tests and for reading what a level keeps)."""
    if packed.dtype == torch.int8:
        return (packed.float() * scales[:, None])[:, :in_features]
    out_features = packed.shape[0]
    chunks = packed.view(out_features, -1, CHUNK[4] // 2)
    nibbles = torch.stack([chunks & 15, chunks >> 4], dim=2).view(out_features, -1, GROUP)
    values = (nibbles.float() - 8) * scales[..., None]
    return values.reshape(out_features, -1)[:, :in_features]


def packed_bytes(out_features: int, in_features: int, bits: int) -> int:
    """Bytes a packed weight and its scales hold."""
    inputs = padded_inputs(in_features, bits)
    if bits == 8:
        return out_features * inputs + 4 * out_features
    return out_features * inputs // 2 + 4 * out_features * inputs // GROUP


class PackedLinear(nn.Module):
    """A weight in one of the packed formats, multiplied by the engine's kernel (float32 in and out)."""

    def __init__(self, weight: torch.Tensor, bits: int):
        super().__init__()
        self.bits = bits
        self.in_features = weight.shape[1]
        packed, scales = (pack_int8 if bits == 8 else pack_int4)(weight)
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        y = torch.ops.playground_cpu.packed_linear(rows, self.packed, self.scales, bias)
        return y.view(*x.shape[:-1], y.shape[-1])
