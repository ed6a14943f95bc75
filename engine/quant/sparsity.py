"""2:4 sparsity (`sparse-2:4`): magnitude pruning of each linear weight to two non-zeros in every four inputs.

In every group of four consecutive input weights of an output row the two of largest magnitude are
kept and the other two set to zero (no retraining, so quality drops: see perplexity). On a CUDA GPU
of compute capability 8.0 or newer, in float16 or bfloat16, the pruned weight is compressed with
`torch.sparse.to_sparse_semi_structured` (kept values plus 2-bit position metadata: 9/16 of the
dense bytes) and multiplied by the sparse tensor cores through it. Everywhere else (a CPU, float32,
an older GPU, a shape the kernels do not take) the pruned weight stays a dense tensor with half its
entries zero, computed by the unquantized path: the same bytes and the same speed as the unpruned
weight, only the quality cost (the plan's notices name such layers). The weights load like float
ones (on the model's device), so a GPU holds the dense model once before compressing it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ConfigError
from engine.model.linear import LinearBase, UnquantizedLinearMethod

LIBRARY = "torch"
MODULE = "torch"
GROUP = 4          # inputs per group
KEPT = 2           # non-zeros kept per group
SPARSE_DTYPES = (torch.float16, torch.bfloat16)
MIN_CAPABILITY = (8, 0)
# Weight rows and inputs must be multiples of these for both of torch's backends (CUTLASS takes
# rows in 32s and inputs in 64s, cuSPARSELt 16s and 16s), so the choice of backend never changes
# which layers are sparse.
ROW_MULTIPLE = 32
INPUT_MULTIPLE = 64
# Compressed bytes over dense bytes for 16-bit weights: half the values, plus 4 bits of metadata per
# group of four (torch's own compression factor for float16/bfloat16).
COMPRESSED_SIXTEENTHS = 9


def prune_2_4(weight: torch.Tensor) -> torch.Tensor:
    """`weight` with the two smallest-magnitude entries of every four consecutive inputs set to zero."""
    out_features, in_features = weight.shape
    groups = weight.reshape(out_features, in_features // GROUP, GROUP)
    kept = groups.abs().topk(KEPT, dim=-1).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, kept, True)
    return (groups * mask).reshape(out_features, in_features)


def shape_problem(out_features: int, in_features: int) -> str | None:
    """Inputs that do not make whole groups of four cannot be pruned 2:4."""
    if in_features % GROUP:
        return f"needs input features in multiples of {GROUP} for 2:4 groups, got {in_features}"
    return None


def dense_reason(out_features: int, in_features: int, dtype: torch.dtype, device: str) -> str | None:
    """Why a pruned weight of this shape stays dense here, or None when the semi-structured kernels take it."""
    if device != "cuda":
        return "no sparse kernel on a CPU"
    if dtype not in SPARSE_DTYPES:
        return f"the sparse kernels take float16 or bfloat16, not {str(dtype).removeprefix('torch.')}"
    if torch.cuda.get_device_capability() < MIN_CAPABILITY:
        return "the GPU predates sparse tensor cores (compute capability 8.0)"
    if out_features % ROW_MULTIPLE or in_features % INPUT_MULTIPLE:
        return (f"the sparse kernels take {ROW_MULTIPLE}s of rows and {INPUT_MULTIPLE}s of inputs, "
                f"not {out_features} x {in_features}")
    return None


def semi_structured(weight: torch.Tensor) -> torch.Tensor:
    """torch's compressed form, by cuSPARSELt where this build has it, else CUTLASS (as `_FORCE_CUTLASS` picks,
    without setting that process-wide flag)."""
    from torch.sparse import to_sparse_semi_structured
    from torch.sparse.semi_structured import SparseSemiStructuredTensorCUTLASS

    if torch.backends.cusparselt.is_available():
        return to_sparse_semi_structured(weight)
    return SparseSemiStructuredTensorCUTLASS.from_dense(weight)


class SparseLinearMethod(UnquantizedLinearMethod):
    """The unquantized layer over its 2:4-pruned weight: where that weight stays dense it is multiplied exactly as
    float weights are (the engine's CPU kernels and fused decode included, hence float's speed); where the sparse
    kernels take it, it is compressed once loaded and multiplied through torch's semi-structured tensor."""

    def __init__(self, device: str):
        self.device = device

    def create_weights(self, layer: LinearBase, input_size: int, output_size: int) -> None:
        problem = shape_problem(output_size, input_size)
        if problem:
            raise ConfigError(f"quantization='sparse-2:4': {layer.prefix} {problem}")
        super().create_weights(layer, input_size, output_size)
        layer.semi_structured = dense_reason(output_size, input_size, layer.build.dtype, self.device) is None

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        pruned = prune_2_4(layer.weight.data)
        if layer.semi_structured:
            layer.weight = nn.Parameter(semi_structured(pruned.contiguous()), requires_grad=False)
        else:
            layer.weight.data.copy_(pruned)  # in place: the weight keeps its huge pages

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if layer.semi_structured:
            return F.linear(x.contiguous(), layer.weight, bias)
        return super().apply(layer, x, bias)

    def planned_storage_bytes(self, layer: LinearBase) -> int:
        return storage_bytes(layer.output_size, layer.input_size, layer.build.dtype, self.device)


def storage_bytes(out_features: int, in_features: int, dtype: torch.dtype, device: str) -> int:
    """Compressed values and metadata where the weight goes semi-structured; otherwise the dense weight."""
    dense = out_features * in_features * torch.finfo(dtype).bits // 8
    if dense_reason(out_features, in_features, dtype, device) is None:
        return dense * COMPRESSED_SIXTEENTHS // 16
    return dense


def plan_notice(layers: list[tuple[str, int, int]], dtype: torch.dtype, device: str) -> str | None:
    """Which linear layers keep a dense pruned weight and why, so a missing speedup is said, not discovered."""
    dense: dict[str, list[str]] = {}
    for name, out_features, in_features in layers:
        reason = dense_reason(out_features, in_features, dtype, device)
        if reason:
            dense.setdefault(reason, []).append(name)
    if not dense:
        return None
    if sum(map(len, dense.values())) == len(layers) and len(dense) == 1:
        return (f"sparse-2:4 keeps every pruned weight dense ({next(iter(dense))}): the unpruned model's bytes "
                "and speed, only the quality cost")
    return "sparse-2:4 keeps these pruned weights dense: " + "; ".join(
        f"{', '.join(names)} ({reason})" for reason, names in dense.items())
