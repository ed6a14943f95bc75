"""Bytes and parameter counts of weights as they really sit in memory, quantized tensors included.

Quantization libraries store a weight in forms `numel() * element_size()` does not describe:
optimum-quanto and torchao as tensor subclasses whose data and scales are inner tensors
(reachable through `__tensor_flatten__`), bitsandbytes as a packed uint8 parameter whose block
scales live in a `quant_state` (4-bit) or an `SCB` attribute (LLM.int8). Counting the storage of
every plain tensor underneath, each storage once, gives the real figure (docs/metrics.md: never
`get_memory_footprint`). bitsandbytes' LLM.int8 layer moves its row scales from the weight to its
matmul `state` at the first call, so a module's `state` is searched too. Both backends report
`weights_bytes` with `weight_storage_bytes`.

`planned_weight_bytes` is the same figure for a model built on the meta device (no storage yet):
each quantized layer's method says what its library will allocate.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn


def _quant_state_tensors(state) -> Iterator[torch.Tensor]:
    """Every tensor of a bitsandbytes QuantState, its nested state (compressed statistics) included."""
    for value in vars(state).values():
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, type(state)):
            yield from _quant_state_tensors(value)


def storage_tensors(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain tensors that hold `tensor`'s data and its quantization scales."""
    if hasattr(tensor, "__tensor_flatten__"):  # quanto / torchao tensor subclasses
        names, _ = tensor.__tensor_flatten__()
        for name in names:
            inner = getattr(tensor, name)
            if inner is not None:
                yield from storage_tensors(inner)
        return
    yield tensor
    quant_state = getattr(tensor, "quant_state", None)  # bitsandbytes 4-bit
    if quant_state is not None:
        yield from _quant_state_tensors(quant_state)
    row_scales = getattr(tensor, "SCB", None)  # bitsandbytes LLM.int8
    if isinstance(row_scales, torch.Tensor):
        yield row_scales


def weight_storage_bytes(module: nn.Module) -> int:
    """Bytes of every parameter and buffer of `module`, scales included, each storage counted once."""
    seen: set[tuple[str, int]] = set()
    total = 0
    tensors = [*module.parameters(), *module.buffers()]
    for layer in module.modules():
        row_scales = getattr(getattr(layer, "state", None), "SCB", None)  # bitsandbytes LLM.int8 after a call
        if isinstance(row_scales, torch.Tensor):
            tensors.append(row_scales)
    for tensor in tensors:
        for leaf in storage_tensors(tensor):
            storage = leaf.untyped_storage()
            key = (str(leaf.device), storage.data_ptr())
            if key in seen:
                continue
            seen.add(key)
            total += storage.nbytes()
    return total


def parameter_count(module: nn.Module) -> int:
    """Parameters of the model as trained (a packed 4-bit weight counts its unpacked elements)."""
    total = 0
    for param in module.parameters():
        quant_state = getattr(param, "quant_state", None)
        total += quant_state.shape.numel() if quant_state is not None else param.numel()
    return total


def planned_weight_bytes(model: nn.Module) -> int:
    """`weight_storage_bytes` of a model built on the meta device, before anything is loaded.

    A layer whose method quantizes (`planned_storage_bytes`) is counted by that method; every other
    parameter (embeddings, norms, biases, unquantized weights) at its own size, tied ones once.
    """
    total = 0
    replaced: set[int] = set()
    for module in model.modules():
        plan = getattr(getattr(module, "method", None), "planned_storage_bytes", None)
        if plan is not None:
            total += plan(module)
            replaced.add(id(module.weight))
    for param in model.parameters():
        if id(param) not in replaced:
            total += param.numel() * param.element_size()
    return total
