"""The engine's per-step overhead on a GPU, fitted to the committed `make gpu-check` runs (assets/results/gpu/).

Why: on a GPU without CUDA graphs a step's time is mostly the host launching several hundred eager operators,
not the roofline, so the what-if projection (`hardware_projection.py`) needs that overhead, and the only honest
source of it is a measurement. Each committed run gives decode steps of known models at known batch sizes:
the `speculative off` rows of its `gpu_check.json` (the 12-layer, ~200M random Llama `gpu_check` builds, 128
prompt tokens, 128 out, one at a time and 32 at once) and, where the run kept it, `decode_1.7b_levels.log` (the
1.7B random Llama in bfloat16, 64 tokens in and out, one at a time and 8 at once). Their overhead is the measured
TPOT minus the roofline time on the run's device (its published figures); a least-squares line over the batch
size gives `Overhead` (base + per sequence). `checks` sets each run's projected TPOT beside its measured one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.hub import PROJECT_ROOT
from engine.info import StepRecord
from engine.model.spec import ModelSpec
from engine.tools.device_table import GPUS, DeviceSpec
from engine.tools.gpu_check import DECODE_MODEL, MODELS, SPEC_LAYERS
from engine.tools.hardware_projection import MeanStep, MeasuredCheck, Overhead, roofline_seconds
from engine.tools.roofline import ModelWork, StepWork

RESULTS = PROJECT_ROOT / "assets" / "results" / "gpu"
BFLOAT16_BYTES = 2
SPEC_WORKLOAD = (128, 128)    # gpu_check's speculative rows: prompt tokens, output tokens (its defaults)
DECODE_WORKLOAD = (64, 64)    # the 1.7B decode table's
DECODE_LOG = "decode_1.7b_levels.log"


@dataclass(frozen=True)
class DecodeRun:
    """One measured decode workload on a GPU: its model's work per step at its batch, and the TPOT measured."""

    folder: str
    device: DeviceSpec
    model: str
    batch: int
    work: MeanStep
    measured_tpot: float  # seconds

    def roofline_seconds(self) -> float:
        return max(roofline_seconds(self.work, self.device.peak_flops["bf16"], self.device.bandwidth))


def _spec(fields: dict) -> ModelSpec:
    return ModelSpec(architecture="LlamaForCausalLM", vocab_size=fields["vocab_size"],
                     hidden_size=fields["hidden_size"], num_layers=fields["num_hidden_layers"],
                     num_heads=fields["num_attention_heads"], num_kv_heads=fields["num_key_value_heads"],
                     head_dim=fields["hidden_size"] // fields["num_attention_heads"],
                     intermediate_size=fields["intermediate_size"], rms_norm_eps=1e-6, tie_word_embeddings=False,
                     qkv_bias=False, o_bias=False, qk_norm=False,
                     max_position_embeddings=fields["max_position_embeddings"], sliding_window=None)


def decode_work(fields: dict, weights_bytes: int, batch: int, workload: tuple[int, int]) -> MeanStep:
    """A bfloat16 decode step of the model `fields` describes, `batch` sequences at the workload's mean context
    (the prompt plus half the output)."""
    spec = _spec(fields)
    kv = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * BFLOAT16_BYTES
    context = batch * (workload[0] + workload[1] / 2)
    step = StepWork.of(StepRecord(time=0.0, duration=0.0, batch_size=batch, num_tokens=batch, num_decode_tokens=batch,
                                  num_running=batch, kv_blocks_used=0, context_tokens=round(context),
                                  attention_pairs=round(context)), ModelWork.of(spec, weights_bytes, kv, "bfloat16"))
    return MeanStep(f"decode, batch {batch}", batch, batch, step.flops, step.weight_bytes,
                           step.kv_read_bytes + step.kv_write_bytes, step.other_bytes, 0.0)


def _device(name: str) -> DeviceSpec | None:
    return next((device for device in GPUS if device.name in name), None)


def _json_lines(path: Path) -> list[dict]:
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.startswith("{")]


def runs_in(folder: Path) -> list[DecodeRun]:
    """The decode measurements of one committed run folder, on a device of the table (none otherwise)."""
    report = json.loads((folder / "gpu_check.json").read_text(encoding="utf-8"))
    device = _device(report.get("device", ""))
    if device is None:
        return []
    spec_model = dict(MODELS["llama"][2], num_hidden_layers=SPEC_LAYERS)
    found = [(f"~200M Llama ({SPEC_LAYERS} layers)", spec_model, row, SPEC_WORKLOAD)
             for row in report.get("speculative", []) if row.get("run") == "speculative off"]
    found += [("1.7B Llama (8 layers)", DECODE_MODEL, row, DECODE_WORKLOAD)
              for row in _json_lines(folder / DECODE_LOG) if row.get("level") == "none"]
    return [DecodeRun(folder.name, device, model, row["concurrency"],
                      decode_work(fields, row["weights_bytes"], row["concurrency"], workload),
                      row["median_tpot_ms"] / 1e3)
            for model, fields, row, workload in found if row.get("median_tpot_ms") and not row.get("errors")]


def committed_runs(root: Path = RESULTS) -> list[DecodeRun]:
    """Every committed run's decode measurements (folders with a `gpu_check.json`)."""
    return [run for path in sorted(root.glob("*/gpu_check.json")) for run in runs_in(path.parent)]


def fit_overhead(runs: list[DecodeRun]) -> Overhead:
    """Least squares of (measured TPOT - roofline time) = base + per_sequence x batch over the runs."""
    xs = [float(run.batch) for run in runs]
    ys = [run.measured_tpot - run.roofline_seconds() for run in runs]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0
    return Overhead(base=mean_y - slope * mean_x, per_sequence=slope)


def checks(runs: list[DecodeRun], overhead: Overhead) -> list[MeasuredCheck]:
    """Each run's decode TPOT projected with `overhead`, beside the measured one."""
    return [MeasuredCheck(run.device.name, f"{run.folder}: {run.model}", run.batch, run.measured_tpot,
                          run.roofline_seconds() + overhead.seconds(run.batch)) for run in runs]
