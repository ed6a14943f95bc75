"""Published figures of the GPUs the what-if projection (`hardware_projection.py`) projects onto.

Why a table of its own: every number here is a vendor's (or, where the vendor publishes none, a named
third party's) and must carry its source, apart from the arithmetic that uses it. The FLOP/s are dense
peaks per precision (the "with sparsity" figures of the datasheets are twice these); "fp32" is the
non-tensor-core float32 rate (torch leaves TF32 off for matmuls by default, and the engine does too),
"bf16" covers float16, "int8" is the integer tensor-core rate in operations per second.
"""

from __future__ import annotations

from dataclasses import dataclass

TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class DeviceSpec:
    """One device's published ceilings: dense peak per precision, memory bandwidth and size, and where they come
    from."""

    name: str
    peak_flops: dict[str, float]  # "fp32" | "bf16" | "int8" -> operations per second, dense
    bandwidth: float              # bytes per second
    memory_bytes: float
    source: str


def _slice(device: DeviceSpec, share: float, name: str, memory_bytes: float, source: str) -> DeviceSpec:
    """A share of `device`'s compute and bandwidth (an assumption stated in `source`)."""
    return DeviceSpec(name, {key: value * share for key, value in device.peak_flops.items()},
                      device.bandwidth * share, memory_bytes, source)


H200 = DeviceSpec("NVIDIA H200", {"fp32": 67 * TERA, "bf16": 989 * TERA, "int8": 1979 * TERA}, 4800 * GIGA,
                  141 * GIGA, "NVIDIA H200 datasheet (SXM): FP32 67 TFLOPS, BF16 1,979 TFLOPS and INT8 3,958 TOPS "
                  "with sparsity (half dense), 4.8 TB/s HBM3e, 141 GB")

GPUS: tuple[DeviceSpec, ...] = (
    DeviceSpec("NVIDIA L4", {"fp32": 30.3 * TERA, "bf16": 121 * TERA, "int8": 242.5 * TERA}, 300 * GIGA,
               24 * GIGA, "NVIDIA L4 datasheet: FP32 30.3 TFLOPS, BF16 242 TFLOPS and INT8 485 TOPS with sparsity "
               "(half dense), 300 GB/s GDDR6, 24 GB"),
    DeviceSpec("NVIDIA A10G", {"fp32": 35 * TERA, "bf16": 70 * TERA, "int8": 140 * TERA}, 600 * GIGA, 24 * GIGA,
               "NVIDIA publishes no A10G datasheet (an AWS G5 part); figures as Baseten's \"NVIDIA A10 vs A10G for "
               "ML model inference\" gives them: FP32 35 TFLOPS, BF16 tensor 70 TFLOPS, INT8 140 TOPS, 600 GB/s "
               "GDDR6 (as the A10), 24 GB"),
    DeviceSpec("NVIDIA A100 80GB", {"fp32": 19.5 * TERA, "bf16": 312 * TERA, "int8": 624 * TERA}, 2039 * GIGA,
               80 * GIGA, "NVIDIA A100 datasheet (80GB SXM): FP32 19.5 TFLOPS, BF16 312 TFLOPS and INT8 624 TOPS "
               "dense, 2,039 GB/s HBM2e"),
    DeviceSpec("NVIDIA H100 SXM", {"fp32": 67 * TERA, "bf16": 989 * TERA, "int8": 1979 * TERA}, 3350 * GIGA,
               80 * GIGA, "NVIDIA H100 datasheet (SXM): FP32 67 TFLOPS, BF16 1,979 TFLOPS and INT8 3,958 TOPS with "
               "sparsity (half dense), 3.35 TB/s HBM3, 80 GB"),
    H200,
    _slice(H200, 0.5, "ZeroGPU (half an H200, assumed)", 70 * GIGA,
           "Hugging Face's ZeroGPU docs (huggingface.co/docs/hub/spaces-zerogpu): \"GPU Type: Nvidia H200 slice, "
           "Available VRAM: 70GB per workload\". They give no compute or bandwidth for the slice; assumed here: half "
           "an H200's (70 of its 141 GB, as a MIG slice gets its share of SMs and memory bandwidth)"),
)
