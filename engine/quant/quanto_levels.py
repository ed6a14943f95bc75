"""optimum-quanto levels: int8, int4 and float8 weights (`quanto-int8`, `quanto-int4`, `quanto-float8`).

A `QLinear` is made from the loaded weight on its device and frozen (the weight is replaced by
quanto's quantized tensor). Scales are per output row for 8-bit types; int4 uses groups along
the input features of 128 (or the largest of 96, 64, 32 that divides them), with a scale and a
shift per group, the way `QLinear` chooses them. int4 values are packed two per byte along the
first dimension of the (grouped) weight.
"""

from __future__ import annotations

import torch
from torch import nn

LIBRARY = "optimum-quanto"
MODULE = "optimum.quanto"
INT4_GROUP_SIZE = 128
INT4_MIN_GROUP_SIZE = 32
INT4_GROUP_STEP = 32
QLINEAR_SCALAR_BUFFERS = 2   # input_scale and output_scale
HALF_CPU_INT8_MULTIPLE = 32  # quanto's half-precision int8 CPU matmul crashes on other input widths


class OutsideInferenceMode(nn.Module):
    """Runs quanto's int4 layer with autograd off but outside `torch.inference_mode`.

    quanto re-wraps its packed int4 weight on every call (a transpose view), which torch refuses
    inside inference mode ("Cannot set version_counter for inference tensor"); the engine's steps
    run in inference mode.
    """

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(False), torch.no_grad():
            return self.inner(x)


def make(weight: torch.Tensor, device: str, weights: str) -> nn.Module:
    import optimum.quanto as quanto

    out_features, in_features = weight.shape
    linear = nn.Linear(in_features, out_features, bias=False, device="meta", dtype=weight.dtype)
    linear.weight = nn.Parameter(weight.to(device), requires_grad=False)
    qtype = {"int8": quanto.qint8, "int4": quanto.qint4, "float8": quanto.qfloat8}[weights]
    qlinear = quanto.QLinear.from_module(linear, weights=qtype)
    qlinear.freeze()
    return OutsideInferenceMode(qlinear.eval()) if weights == "int4" else qlinear.eval()


def build_cpu_extension() -> str:
    """Compile optimum-quanto's C++ CPU extension (int4 unpacking) now; returns its build folder.

    quanto otherwise compiles it at the first int4 forward pass on a CPU: a minute or more on a small
    machine, inside an engine's load. The project's install steps (`make kernels`) call this, so that it
    happens ahead of time, like the engine's own kernels; an existing build is only loaded.
    """
    from optimum.quanto.library.extensions import get_extension

    extension = get_extension("quanto_cpp")
    extension.lib  # noqa: B018 (the property builds and loads the library)
    return extension.build_directory


def int4_group_size(in_features: int) -> int | None:
    """The group size `QLinear` picks for int4 weights (None: one scale per output row)."""
    size = INT4_GROUP_SIZE
    if in_features <= size:
        return None
    while in_features % size and size > INT4_MIN_GROUP_SIZE:
        size -= INT4_GROUP_STEP
    return size if in_features % size == 0 else None


def eight_bit_bytes(out_features: int, in_features: int, dtype: torch.dtype, device: str) -> int:
    """One byte per weight and one scale per output row (in the model dtype), plus QLinear's two scalars."""
    element = torch.empty((), dtype=dtype).element_size()
    return out_features * in_features + out_features * element + QLINEAR_SCALAR_BUFFERS * element


def int4_bytes(out_features: int, in_features: int, dtype: torch.dtype, device: str) -> int:
    """Two weights per byte; a scale and a shift per group (in the model dtype); QLinear's two scalars."""
    element = torch.empty((), dtype=dtype).element_size()
    group = int4_group_size(in_features)
    rows, columns = (out_features * in_features // group, group) if group else (out_features, in_features)
    packed = (rows + 1) // 2 * columns
    return packed + 2 * rows * element + QLINEAR_SCALAR_BUFFERS * element


def int8_shape_problem(out_features: int, in_features: int, dtype: torch.dtype, device: str) -> str | None:
    """Refuse the shapes on which quanto's int8 kernel would crash the process instead of raising."""
    if device == "cpu" and dtype in (torch.bfloat16, torch.float16) and in_features % HALF_CPU_INT8_MULTIPLE:
        return (f"has {in_features} input features: optimum-quanto's int8 CPU matmul in {dtype} needs multiples "
                f"of {HALF_CPU_INT8_MULTIPLE} (use float32 on this CPU)")
    return None


def hf_config(dtype: torch.dtype, weights: str):
    from transformers import QuantoConfig

    return QuantoConfig(weights=weights)
