"""The fastest form of `x @ weight.T (+ bias)` on this machine, chosen per weight shape by measuring it.

Three forms compute the same product on a CPU: MKL's GEMM (`F.linear`), oneDNN's float32 matmul
(`torch.ops.mkldnn._linear_pointwise`, the kernel torch.compile itself emits for CPU linears) and
the engine's small-batch kernel (model/cpu_kernels.py: each weight row read once for up to eight
rows of x). Measured on the development machine (AMD EPYC, AVX-512; single thread, every linear
layer of random-llama-20m in turn): at 8 rows the kernel takes 3.3 ms, oneDNN 4.6, MKL 7.1; at 32
rows oneDNN 7.9, the kernel 10.0, MKL 14.4; a 2048-token prefill 310 ms with oneDNN, 646 with MKL. On two
threads (one layer and the LM head) the kernel still wins at 8 rows (1.11 vs 1.24 ms) and loses at 16 (2.32 vs 2.04).
MKL's AVX-512 paths are not used on this CPU; on another one MKL may win, so which of MKL and
oneDNN serves more than `SMALL_BATCH_MAX_ROWS` rows is measured once per weight shape when a layer
is built (random inputs of the layer's shape; a few milliseconds). The weight keeps the [out, in]
layout it was loaded in: on this machine a pre-transposed copy made neither form faster.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.model import cpu_kernels

SMALL_BATCH_MAX_ROWS = 8
MEASURE_ROWS = 32
MEASURE_REPEATS = 3


@dataclass(frozen=True)
class MatmulPlan:
    """How one layer multiplies: the small-batch kernel up to `SMALL_BATCH_MAX_ROWS` rows, then `large`."""

    small_batch_kernel: bool
    large: str  # "onednn" | "mkl"


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _median_seconds(run) -> float:
    run()
    samples = []
    for _ in range(MEASURE_REPEATS):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


@functools.cache
def _faster_large_form(out_features: int, in_features: int) -> str:
    """'onednn' or 'mkl', whichever multiplies MEASURE_ROWS rows by a float32 [out, in] weight faster here."""
    weight = torch.randn(out_features, in_features)
    x = torch.randn(MEASURE_ROWS, in_features)
    with torch.inference_mode():
        onednn = _median_seconds(lambda: _onednn_linear(x, weight, None))
        mkl = _median_seconds(lambda: F.linear(x, weight))
    return "onednn" if onednn < mkl else "mkl"


def plan_matmul(out_features: int, in_features: int, dtype: torch.dtype, device, cpu_kernels_on: bool) -> MatmulPlan:
    """The plan of a layer with an [out_features, in_features] weight (measured on CPUs in float32 only)."""
    if torch.device(device).type != "cpu" or dtype != torch.float32 or not onednn_available():
        return MatmulPlan(small_batch_kernel=False, large="mkl")
    return MatmulPlan(small_batch_kernel=cpu_kernels_on, large=_faster_large_form(out_features, in_features))


def linear(plan: MatmulPlan, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T (+ bias) in the plan's form for this many rows."""
    if plan.small_batch_kernel and x.dim() == 2 and x.shape[0] <= SMALL_BATCH_MAX_ROWS:
        return cpu_kernels.small_batch_linear(x.contiguous(), weight, bias)
    if plan.large == "onednn":
        return _onednn_linear(x, weight, bias)
    return F.linear(x, weight, bias)
