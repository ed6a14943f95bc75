"""torchao weight-only levels: int8 (`torchao-int8`, CPU and GPU) and int4 (`torchao-int4`, CUDA only).

`quantize_` swaps an `nn.Linear`'s weight for torchao's quantized tensor on the layer's device.
int8 keeps one scale (and zero point) per output row; int4 uses groups of 128 input features and
the tile-packed layout of the tinygemm kernel, which needs a CUDA GPU (compute capability 8.0 or
newer) and bfloat16, and pads input features to a multiple of 1024 and outputs to a multiple of 8.
"""

from __future__ import annotations

import math

import torch
from torch import nn

LIBRARY = "torchao"
MODULE = "torchao"
INT4_GROUP_SIZE = 128
INT4_IN_MULTIPLE = 1024
INT4_OUT_MULTIPLE = 8
FLOAT32_BYTES = 4


def _quantized(weight: torch.Tensor, device: str, config) -> nn.Module:
    from torchao.quantization import quantize_

    out_features, in_features = weight.shape
    linear = nn.Linear(in_features, out_features, bias=False, device="meta", dtype=weight.dtype)
    linear.weight = nn.Parameter(weight.to(device), requires_grad=False)
    quantize_(linear, config)
    return linear.eval()


def make_int8(weight: torch.Tensor, device: str) -> nn.Module:
    from torchao.quantization import Int8WeightOnlyConfig

    return _quantized(weight, device, Int8WeightOnlyConfig())


def int8_bytes(out_features: int, in_features: int, dtype: torch.dtype, device: str) -> int:
    """One byte per weight; per output row a float32 scale and an int8 zero point."""
    return out_features * in_features + out_features * (FLOAT32_BYTES + 1)


def _int4_config():
    from torchao.quantization import Int4WeightOnlyConfig

    return Int4WeightOnlyConfig(group_size=INT4_GROUP_SIZE, int4_packing_format="tile_packed_to_4d")


def make_int4(weight: torch.Tensor, device: str) -> nn.Module:
    return _quantized(weight, device, _int4_config())


def int4_shape_problem(out_features: int, in_features: int, dtype: torch.dtype, device: str) -> str | None:
    """torchao leaves a weight whose input features are not whole groups unquantized: refuse it instead."""
    if in_features % INT4_GROUP_SIZE:
        return f"needs input features in multiples of {INT4_GROUP_SIZE}, got {in_features}"
    return None


def int4_bytes(out_features: int, in_features: int, dtype: torch.dtype, device: str) -> int:
    """Two weights per byte over the padded shape; a bfloat16 scale and zero per group and output."""
    padded_out = math.ceil(out_features / INT4_OUT_MULTIPLE) * INT4_OUT_MULTIPLE
    padded_in = math.ceil(in_features / INT4_IN_MULTIPLE) * INT4_IN_MULTIPLE
    scales_and_zeros = (padded_in // INT4_GROUP_SIZE) * padded_out * 2 * torch.finfo(torch.bfloat16).bits // 8
    return padded_out * padded_in // 2 + scales_and_zeros


def hf_int8(dtype: torch.dtype):
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import TorchAoConfig

    return TorchAoConfig(Int8WeightOnlyConfig())


def hf_int4(dtype: torch.dtype):
    from transformers import TorchAoConfig

    return TorchAoConfig(_int4_config())
