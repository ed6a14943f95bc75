"""Recorded steps and a projection setting made by hand, for the roofline's and the what-if projection's tests:
decode and prefill `StepRecord`s with known work, ceilings and model work coefficients with round numbers."""

from __future__ import annotations

from types import SimpleNamespace

from engine import StepRecord
from engine.tools.device_table import DeviceSpec
from engine.tools.roofline import DeviceCeilings, ModelWork

# 100 GFLOP/s and 10 GB/s, measured "here"
CEILINGS = DeviceCeilings(device="test CPU", dtype="float32", threads=2, peak_flops=1e11, bandwidth=1e10,
                          matmul_size=8, bandwidth_bytes=8, measured_at="now", seconds=0.0)
WORK = ModelWork(linear_flops_per_token=2e6, lm_head_flops_per_row=1e5, attention_flops_per_pair=1e3,
                 weight_bytes_per_step=4_000_000, embedding_bytes_per_token=256, kv_bytes_per_token=1024,
                 logits_bytes_per_row=4000)
# 10 TFLOP/s in fp32, 100 in bf16, 100 GB/s
DEVICE = DeviceSpec("test GPU", {"fp32": 1e13, "bf16": 1e14, "int8": 2e14}, 1e11, 1e10, "hand-made")
# what the projection reads of an EngineInfo
INFO = SimpleNamespace(dtype="float32", quantization="none", cuda_graphs=False, device="cpu")


def decode_step(batch: int, context: int, seconds: float = 1e-3) -> StepRecord:
    return StepRecord(time=0.0, duration=seconds, batch_size=batch, num_tokens=batch, num_decode_tokens=batch,
                      num_running=batch, kv_blocks_used=0, num_output_tokens=batch,
                      context_tokens=batch * context, attention_pairs=batch * context)


def prefill_step(tokens: int, seconds: float = 1e-2) -> StepRecord:
    return StepRecord(time=0.0, duration=seconds, batch_size=1, num_tokens=tokens, num_decode_tokens=1,
                      num_running=1, kv_blocks_used=0, num_output_tokens=1, context_tokens=tokens,
                      attention_pairs=tokens * (tokens + 1) // 2)
