"""The quantization levels: what each is, which library computes it, where it runs, what it costs.

A level is plain data plus functions from its library's adapter (`bnb_levels`, `quanto_levels`,
`torchao_levels`, `model/packed_linear` for the engine's own formats, `sparsity` for 2:4 pruning): build the
library's quantized linear module from a loaded full-precision weight (or, for 2:4 pruning, a
linear method of its own), the bytes that module will hold (packed storage plus scales, known
before loading, for `estimate_memory`), and the `transformers` quantization config that gives the
hf baseline the same level (None where transformers has none: the engine's own formats and 2:4
pruning, which only the native backend computes). Nothing here imports a quantization library, so
`engine.config` can list the levels and say which are available without loading any of them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from engine.model import packed_linear
from engine.quant import bnb_levels, quanto_levels, sparsity, torchao_levels


@dataclass(frozen=True)
class QuantLevel:
    """One weight-quantization level and the library that implements it."""

    name: str
    library: str                      # the pip package, as the UI names it
    module: str                       # its import name, to tell whether it is installed
    summary: str
    make_linear: Callable[[torch.Tensor, str], nn.Module] | None  # (loaded weight, device) -> quantized module
    storage_bytes: Callable[[int, int, torch.dtype, str], int]  # (out, in, dtype, device) -> bytes held
    hf_config: Callable[[torch.dtype], object] | None        # model dtype -> transformers quantization config
    devices: tuple[str, ...] = ("cpu", "cuda")
    device_reason: str = ""           # why it cannot run on the devices it lacks
    dtypes: tuple[torch.dtype, ...] | None = None            # compute dtypes it accepts (None: any)
    shape_problem: Callable[[int, int, torch.dtype, str], str | None] = field(
        default=lambda out_features, in_features, dtype, device: None)
    slow_on: tuple[tuple[str, str], ...] = ()                # (device, note shown beside the choice)
    engine_kernels: bool = False      # computed by the engine's own CPU kernels: native backend, kernels built
    lm_head_bits: int | None = None   # the LM head packed too, at this many bits (None: left in the model dtype)
    # device -> the level's own LinearMethod, for a level that is not a library module over a staged weight
    method: Callable[[str], object] | None = None
    # (layer name, out, in) of one rank's linear layers, dtype, device -> a plan notice, e.g. which stay dense
    plan_notice: Callable[[list[tuple[str, int, int]], torch.dtype, str], str | None] | None = None

    def installed(self) -> bool:
        return importlib.util.find_spec(self.module) is not None

    def note(self, device: str) -> str | None:
        return dict(self.slow_on).get(device)

    @property
    def packs(self) -> str:
        """Which of the model's tensors the level changes, for its description."""
        if self.lm_head_bits:
            return (f"packs the decoder's linear layers and the LM head (int{self.lm_head_bits}); the embeddings stay "
                    "in the model dtype")
        return "changes the decoder's linear layers only; the LM head and the embeddings stay in the model dtype"


def _engine_format(bits: int, summary: str) -> QuantLevel:
    return QuantLevel(f"native-int{bits}", "engine", "torch", summary,
                      lambda weight, device: packed_linear.PackedLinear(weight, bits),
                      partial(_packed_bytes, bits=bits), None, devices=("cpu",),
                      device_reason="the engine's packed formats are computed by its CPU kernels only",
                      dtypes=(torch.float32,), engine_kernels=True, lm_head_bits=8)


def _packed_bytes(out_features: int, in_features: int, dtype: torch.dtype, device: str, bits: int) -> int:
    return packed_linear.packed_bytes(out_features, in_features, bits)


def _bitsandbytes_4bit(quant_type: str, summary: str) -> QuantLevel:
    return QuantLevel(quant_type, bnb_levels.LIBRARY, bnb_levels.MODULE, summary,
                      partial(bnb_levels.make_4bit, quant_type=quant_type), bnb_levels.four_bit_bytes,
                      partial(bnb_levels.hf_4bit, quant_type=quant_type),
                      slow_on=(("cpu", "slower on CPU: bitsandbytes dequantizes the 4-bit weights on every call "
                                       "(about 2.5x float32's time per token at batch 1 in our CPU table)"),))


def _quanto(weights: str, summary: str, storage_bytes, **options) -> QuantLevel:
    return QuantLevel(f"quanto-{weights}", quanto_levels.LIBRARY, quanto_levels.MODULE, summary,
                      partial(quanto_levels.make, weights=weights), storage_bytes,
                      partial(quanto_levels.hf_config, weights=weights), **options)


LEVELS: dict[str, QuantLevel] = {level.name: level for level in (
    _engine_format(8, "int8 weights with a scale per output row; activations quantized to int8 per row on the fly; "
                      "integer kernels (AVX-512 VNNI, AVX2)"),
    _engine_format(4, "4-bit weights with a scale per 32 inputs (Q4_0-like); activations quantized to int8 per row "
                      "on the fly; integer kernels (AVX-512 VNNI, AVX2)"),
    QuantLevel("int8", bnb_levels.LIBRARY, bnb_levels.MODULE,
               "LLM.int8: int8 weights, per-row scales, float16 outlier features",
               bnb_levels.make_int8, bnb_levels.int8_bytes, bnb_levels.hf_int8,
               slow_on=(("cpu", "slow on CPU: bitsandbytes quantizes every input row and splits out outliers "
                                "(about 6x float32's time per token at batch 1 in our CPU table)"),)),
    _bitsandbytes_4bit("nf4", "4-bit NormalFloat in blocks of 64 (QLoRA's format), compressed statistics"),
    _bitsandbytes_4bit("fp4", "4-bit float in blocks of 64, compressed statistics"),
    _quanto("int8", "int8 weights, per-row scales", quanto_levels.eight_bit_bytes,
            shape_problem=quanto_levels.int8_shape_problem,
            slow_on=(("cpu", "slow on CPU (about 7x float32's time per token at batch 1 in our CPU table)"),)),
    _quanto("int4", "int4 weights, a scale and shift per group of up to 128 inputs", quanto_levels.int4_bytes,
            slow_on=(("cpu", "slow on CPU: quanto unpacks the int4 weights on every call "
                             "(about 11x float32's time per token at batch 1 in our CPU table)"),)),
    _quanto("float8", "float8 (e4m3) weights, per-row scales", quanto_levels.eight_bit_bytes,
            slow_on=(("cpu", "very slow on CPU: the float8 weights are dequantized on every call "
                             "(about 10x float32's time per token at batch 1 in our CPU table)"),)),
    QuantLevel("torchao-int8", torchao_levels.LIBRARY, torchao_levels.MODULE,
               "int8 weight-only, per-row scales",
               torchao_levels.make_int8, torchao_levels.int8_bytes, torchao_levels.hf_int8,
               slow_on=(("cpu", "slower on CPU: torchao dequantizes the int8 weights on the fly "
                                "(about 2.5x float32's time per token at batch 1 in our CPU table)"),)),
    QuantLevel("torchao-int4", torchao_levels.LIBRARY, torchao_levels.MODULE,
               "int4 weight-only, groups of 128, tinygemm's tile-packed layout",
               torchao_levels.make_int4, torchao_levels.int4_bytes, torchao_levels.hf_int4,
               devices=("cuda",), device_reason="torchao's int4 weight-only kernel (tinygemm) runs only on a CUDA GPU",
               dtypes=(torch.bfloat16,), shape_problem=torchao_levels.int4_shape_problem),
    QuantLevel("sparse-2:4", sparsity.LIBRARY, sparsity.MODULE,
               "2:4 sparsity: the 2 largest of every 4 input weights kept (magnitude pruning, no retraining); "
               "semi-structured sparse kernels on a CUDA GPU (compute capability 8.0+, float16/bfloat16)",
               None, sparsity.storage_bytes, None, method=sparsity.SparseLinearMethod,
               slow_on=(("cpu", "no speedup on CPU: the pruned weights stay dense with half the entries zero, "
                                "so float32's bytes and speed, only the quality cost"),),
               plan_notice=sparsity.plan_notice),
)}
