"""`QuantizedLinearMethod`: a linear layer whose weight a quantization library packs once it is loaded.

Which layers: every `LinearBase` of the native model, that is the fused QKV, the output
projection, the fused gate/up and the down projection of each decoder layer. The embeddings and
the LM head are not linear layers of the model (`VocabParallelEmbedding`, `ParallelLMHead`) and
stay in the model dtype, as transformers' quantizers leave `lm_head` by default, except for the
engine's own formats, which pack the head as well (`PackedHeadMethod`): on small models it is a
large share of the bytes a decode step reads. A tied embedding keeps its float weight for lookups.

The checkpoint's tensors are loaded into a full-precision staging weight on the CPU (the layers'
own loaders fuse and shard them there). `process_weights_after_loading` then hands that weight
to the library, which quantizes it on the model's device: on a GPU, only one layer's
full-precision weight is there at a time, never the whole model's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.errors import ConfigError
from engine.model.linear import LinearBase, LinearMethod, UnquantizedLinearMethod
from engine.model.packed_linear import PackedLinear, packed_bytes
from engine.quant.levels import LEVELS, QuantLevel

STAGING_DEVICE = "cpu"


class QuantizedLinearMethod:
    """Stages the loaded weight on the CPU, then computes with the level's library module."""

    def __init__(self, level: QuantLevel, device: str):
        self.level = level
        self.device = device

    def create_weights(self, layer: LinearBase, input_size: int, output_size: int) -> None:
        problem = self.level.shape_problem(output_size, input_size, layer.build.dtype, self.device)
        if problem:
            raise ConfigError(f"quantization={self.level.name!r}: {layer.prefix} {problem}")
        staging = "meta" if torch.device(layer.build.device).type == "meta" else STAGING_DEVICE
        layer.weight = nn.Parameter(torch.empty(output_size, input_size, dtype=layer.build.dtype, device=staging),
                                    requires_grad=False)

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        weight = layer.weight.data
        del layer.weight
        layer.quantized = self.level.make_linear(weight, self.device)

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = layer.quantized(x)
        return out if bias is None else out + bias

    def planned_storage_bytes(self, layer: LinearBase) -> int:
        """What the library will hold for this layer's weight (its bias is a separate parameter)."""
        return self.level.storage_bytes(layer.output_size, layer.input_size, layer.build.dtype, self.device)


class PackedHeadMethod:
    """The LM head of a level that packs it (`QuantLevel.lm_head_bits`): the loaded rows packed once, computed by
    the engine's kernel; the float weight is freed unless the embedding shares it."""

    def __init__(self, bits: int):
        self.bits = bits

    def process_weights_after_loading(self, head: nn.Module) -> None:
        head.packed = PackedLinear(head.weight.data, self.bits)
        if not head.tied_to_embedding:
            head.weight = nn.Parameter(head.weight.data.new_empty(0, head.weight.shape[1]), requires_grad=False)

    def apply(self, head: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return head.packed(x, bias)

    def planned_storage_bytes(self, head: nn.Module) -> int:
        rows, inputs = head.weight.shape
        tied = head.weight.numel() * head.weight.element_size() if head.tied_to_embedding else 0
        return packed_bytes(rows, inputs, self.bits) + tied


def check_level(quantization: str, dtype: torch.dtype, backend: str = "native") -> QuantLevel | None:
    """The level to build (None for `none`), refusing a compute dtype its library does not take, and the native-only
    levels (the engine's own formats, 2:4 pruning) on the hf backend (transformers has no config for them)."""
    if quantization == "none":
        return None
    level = LEVELS[quantization]
    if backend == "hf" and level.hf_config is None:
        raise ConfigError(f"quantization={quantization!r} runs in the native engine only: transformers cannot load "
                          "it (it has no quantization config for this level); use backend='native'")
    if level.dtypes is not None and dtype not in level.dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in level.dtypes)
        raise ConfigError(f"quantization={quantization!r} computes in {names}; set dtype accordingly "
                          f"(this configuration resolves to {str(dtype).removeprefix('torch.')})")
    return level


def lm_head_method_factory(quantization: str) -> Callable[[], PackedHeadMethod] | None:
    """`BuildContext.lm_head_method` for a level that packs the LM head too (None: the head stays as loaded)."""
    level = LEVELS.get(quantization)
    bits = level.lm_head_bits if level else None
    return (lambda: PackedHeadMethod(bits)) if bits else None


def linear_method_factory(quantization: str, device: str, dtype: torch.dtype) -> Callable[[str], LinearMethod]:
    """`BuildContext.linear_method` for a quantization level: the same method for every linear layer."""
    level = check_level(quantization, dtype)
    if level is None:
        return lambda prefix: UnquantizedLinearMethod()
    method = level.method(device) if level.method else QuantizedLinearMethod(level, device)
    return lambda prefix: method
