"""bitsandbytes levels: LLM.int8 (`int8`) and 4-bit NormalFloat / float (`nf4`, `fp4`).

bitsandbytes quantizes a weight when its parameter is moved to a device, so a layer's weight,
loaded on the CPU, is quantized where it will run. On CPU, bitsandbytes 0.50 runs all three (its
LLM.int8 casts inputs to float16 there, as on a GPU, and splits out outlier features above 6.0).
4-bit weights use blocks of 64 with compressed statistics (the block scales themselves quantized
to 8 bits), which is also what the hf baseline is configured with.

On a CPU with AVX512-BF16, bitsandbytes re-lays a 4-bit weight for its CPU kernel at the first
inference call (bfloat16 block scales, no compressed statistics; much faster at batch 1). That
layout needs output features in multiples of 32 and input features in whole blocks; a layer that
does not fit keeps the portable layout. The native engine makes the change at load, so the bytes
it reports are the bytes it computes with.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

LIBRARY = "bitsandbytes"
MODULE = "bitsandbytes"
OUTLIER_THRESHOLD = 6.0
BLOCK_SIZE = 64            # 4-bit quantization block (bitsandbytes' default)
STATISTICS_BLOCK = 256     # compressed statistics: block scales quantized in blocks of 256
FLOAT32_BYTES = 4
CODE_4BIT_ENTRIES = 16     # the NF4 / FP4 value table
CODE_8BIT_ENTRIES = 256    # the dynamic 8-bit map of the compressed statistics
CPU_LAYOUT_ROWS = 32       # the CPU layout packs output features in groups of 32
BFLOAT16_BYTES = 2


class _DropFloat16CastNotice(logging.Filter):
    """LLM.int8 logs that it casts inputs to float16 on every call: that is the method, not news."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "will be cast from" not in record.getMessage()


def _import_bitsandbytes():
    import bitsandbytes

    logger = logging.getLogger("bitsandbytes.autograd._functions")
    if not any(isinstance(f, _DropFloat16CastNotice) for f in logger.filters):
        logger.addFilter(_DropFloat16CastNotice())
    return bitsandbytes


def make_int8(weight: torch.Tensor, device: str) -> nn.Module:
    """A `Linear8bitLt` (inference mode: int8 weights and row scales, no float copy kept)."""
    bnb = _import_bitsandbytes()
    out_features, in_features = weight.shape
    linear = bnb.nn.Linear8bitLt(in_features, out_features, bias=False, has_fp16_weights=False,
                                 threshold=OUTLIER_THRESHOLD, device="meta")
    linear.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    return linear.to(device).eval()


def int8_bytes(out_features: int, in_features: int, dtype: torch.dtype, device: str) -> int:
    """int8 weights plus one float32 scale per output row."""
    return out_features * in_features + out_features * FLOAT32_BYTES


def uses_cpu_layout(out_features: int, in_features: int, device: str) -> bool:
    """Whether bitsandbytes re-lays this 4-bit weight for its AVX512-BF16 CPU kernel."""
    if device != "cpu" or out_features % CPU_LAYOUT_ROWS or in_features % BLOCK_SIZE:
        return False
    from bitsandbytes.functional import has_avx512bf16

    return bool(has_avx512bf16())


def make_4bit(weight: torch.Tensor, device: str, quant_type: str) -> nn.Module:
    """A `Linear4bit` computing in the weight's dtype, in the layout it will compute with."""
    bnb = _import_bitsandbytes()
    out_features, in_features = weight.shape
    linear = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=weight.dtype,
                               compress_statistics=True, quant_type=quant_type, device="meta")
    linear.weight = bnb.nn.Params4bit(weight, requires_grad=False, blocksize=BLOCK_SIZE, compress_statistics=True,
                                      quant_type=quant_type)
    linear = linear.to(device).eval()
    if uses_cpu_layout(out_features, in_features, device):
        with torch.inference_mode():
            linear(torch.zeros(1, in_features, dtype=weight.dtype))
    else:
        linear.support_avx512bf16_for_cpu = False
    return linear


def four_bit_bytes(out_features: int, in_features: int, dtype: torch.dtype, device: str) -> int:
    """Two weights per byte plus block scales: per block of 64 an 8-bit scale, per 256 of those a float32
    scale and the two code tables; in the CPU layout one bfloat16 scale per block and the 4-bit table."""
    elements = out_features * in_features
    blocks = math.ceil(elements / BLOCK_SIZE)
    packed = (elements + 1) // 2
    offset = FLOAT32_BYTES
    if uses_cpu_layout(out_features, in_features, device):
        return packed + blocks * BFLOAT16_BYTES + CODE_4BIT_ENTRIES * FLOAT32_BYTES + offset
    statistics = blocks + math.ceil(blocks / STATISTICS_BLOCK) * FLOAT32_BYTES + offset
    tables = (CODE_4BIT_ENTRIES + CODE_8BIT_ENTRIES) * FLOAT32_BYTES
    return packed + statistics + tables


def hf_int8(dtype: torch.dtype):
    from transformers import BitsAndBytesConfig

    _import_bitsandbytes()
    return BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=OUTLIER_THRESHOLD)


def hf_4bit(dtype: torch.dtype, quant_type: str):
    from transformers import BitsAndBytesConfig

    _import_bitsandbytes()
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type, bnb_4bit_compute_dtype=dtype,
                              bnb_4bit_use_double_quant=True)
