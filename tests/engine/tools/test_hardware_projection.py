"""What-if hardware: the projection's arithmetic on hand-computed steps, the toggle read from the dominant term,
the device table's figures, and the GPU overhead fitted to the committed H200 run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.tools.device_table import GPUS, H200
from engine.tools.gpu_calibration import checks, committed_runs, decode_work, fit_overhead
from engine.tools.hardware_projection import (
    MeanStep,
    Overhead,
    Setting,
    estimate,
    precision_of,
    project,
)
from engine.tools.roofline import analyze
from engine.tools.what_if import calibration, describe_calibration
from tests.support.paths import PROJECT_ROOT
from tests.support.roofline_steps import CEILINGS, DEVICE, INFO, WORK, decode_step, prefill_step

GPU_BF16 = Setting("bf16", quantized=False, cuda_graphs=False, gpu=True)
H200_ERROR = 0.08  # the largest |projected / measured - 1| over the committed H200 run's decode points


def _work(phase: str, batch: float, flops: float, weights: float, kv: float, tokens: float | None = None):
    return MeanStep(phase, batch, tokens if tokens is not None else batch, flops, weights, kv, 0.0, 0.0)


def test_memory_bound_decode_is_bytes_over_bandwidth_plus_overhead():
    work = _work("decode, batch 1", 1, flops=2e9, weights=2e9, kv=1e8)  # 2.1 GB at 100 GB/s: 21 ms
    step = estimate(work, DEVICE, GPU_BF16, Overhead(1e-3, 2e-4).seconds(1))
    assert step.compute_seconds == pytest.approx(2e9 / 1e14)
    assert step.memory_seconds == pytest.approx(0.021)
    assert step.seconds == pytest.approx(0.021 + 0.0012)
    assert step.bound == "memory" and step.tokens_per_second == pytest.approx(1 / 0.0222)
    assert "quantization" in step.toggle and "weights are 95%" in step.toggle


def test_compute_bound_prefill_is_flops_over_the_precisions_peak_plus_overhead():
    work = _work("prefill", 4, flops=1e12, weights=2e9, kv=5e7, tokens=2048)
    bf16 = estimate(work, DEVICE, GPU_BF16, 1e-3)
    assert bf16.compute_seconds == pytest.approx(0.01) and bf16.memory_seconds == pytest.approx(0.0205)
    fp32 = estimate(work, DEVICE, Setting("fp32", False, False, True), 1e-3)
    assert fp32.compute_seconds == pytest.approx(0.1) and fp32.seconds == pytest.approx(0.101)
    assert fp32.bound == "compute" and fp32.tokens_per_second == pytest.approx(2048 / 0.101)
    assert fp32.toggle.startswith("dtype=bfloat16: 10x the float32 peak")


def test_the_toggle_follows_the_dominant_term():
    """Fails if the suggestion were one string: each dominant term (and whose bytes dominate) names its own."""
    decode = _work("decode, batch 1", 1, flops=2e6, weights=4e6, kv=1e5)
    overhead_gpu = estimate(decode, DEVICE, GPU_BF16, 0.011)
    overhead_cpu = estimate(decode, DEVICE, Setting("bf16", False, False, gpu=False), 0.011)
    weights = estimate(decode, DEVICE, GPU_BF16, 0.0)
    quantized = estimate(decode, DEVICE, Setting("bf16", True, False, True), 0.0)
    fp32_cpu = estimate(decode, DEVICE, Setting("fp32", False, False, False), 0.0)
    kv = estimate(_work("decode, batch 64", 64, flops=1e8, weights=4e6, kv=4e7), DEVICE, GPU_BF16, 0.0)
    prefill = estimate(_work("prefill", 1, flops=1e12, weights=4e6, kv=1e5, tokens=512), DEVICE, GPU_BF16, 0.0)
    prefill_overhead = estimate(_work("prefill", 1, flops=1e6, weights=4e6, kv=1e5), DEVICE, GPU_BF16, 0.011)
    assert [s.bound for s in (overhead_gpu, weights, kv, prefill)] == ["overhead", "memory", "memory", "compute"]
    assert overhead_gpu.toggle.startswith("CUDA graphs")
    assert overhead_cpu.toggle.startswith("a bigger batch")
    assert weights.toggle.startswith("quantization")
    assert quantized.toggle.startswith("a bigger batch: the weights are read once")
    assert fp32_cpu.toggle.startswith("quantization=native-int8")
    assert kv.toggle.startswith("kv_cache_dtype=int8") and "K/V are 91%" in kv.toggle
    assert prefill.toggle.startswith("prefix caching")
    assert prefill_overhead.toggle.startswith("more prompts per step")
    every = [overhead_gpu, overhead_cpu, weights, quantized, fp32_cpu, kv, prefill, prefill_overhead]
    assert len({step.toggle.split(":")[0] for step in every}) == len(every)


def test_precision_follows_the_dtype_and_the_integer_levels():
    assert precision_of("float32", "none") == "fp32"
    assert precision_of("bfloat16", "torchao-int8") == "bf16"  # weight-only: dequantized to the dtype
    assert precision_of("float32", "native-int8") == "int8"




def test_a_report_is_projected_on_its_own_device_as_measured_and_on_each_gpu_with_the_overhead():
    steps = [decode_step(1, 100, 2e-3), decode_step(1, 101, 2e-3), decode_step(8, 100, 3e-3),
             prefill_step(512, 0.5)]
    report = analyze(steps, WORK, CEILINGS)
    overhead = Overhead(0.01, 0.001)
    projection = project(report, INFO, (DEVICE,), overhead)
    here, gpu = projection.devices
    assert here.measured_here and here.device.name == "test CPU (measured here)"
    # on the device it ran on, the overhead is what the step took beyond its roofline: the total is the measurement
    assert [step.seconds for step in here.decode] == pytest.approx([2e-3, 3e-3])
    assert here.prefill.seconds == pytest.approx(0.5)
    batch8 = gpu.decode[1]
    work8 = report.decode_by_batch[1]
    assert batch8.overhead_seconds == pytest.approx(0.018)
    assert batch8.seconds == pytest.approx(max(work8.flops / 1e13, work8.bytes / 1e11) + 0.018)
    assert batch8.tokens_per_second == pytest.approx(8 / batch8.seconds)
    assert projection.to_dict()["estimate"] is True and "estimates" in projection.notes[0]


def test_the_device_table_names_a_source_for_every_figure():
    assert [device.name for device in GPUS] == ["NVIDIA L4", "NVIDIA A10G", "NVIDIA A100 80GB", "NVIDIA H100 SXM",
                                                "NVIDIA H200", "ZeroGPU (half an H200, assumed)"]
    for device in GPUS:
        assert set(device.peak_flops) == {"fp32", "bf16", "int8"} and device.source
        assert device.peak_flops["bf16"] > device.peak_flops["fp32"] and device.bandwidth > 0
    zero = GPUS[-1]
    assert zero.bandwidth == H200.bandwidth / 2 and zero.peak_flops["bf16"] == H200.peak_flops["bf16"] / 2
    assert "70GB per workload" in zero.source


def test_the_overhead_fit_recovers_a_line_through_exact_points():
    work = decode_work({"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256},
                       100_000, 1, (16, 16))
    runs = []
    for batch in (1, 4, 16):
        run = SimpleNamespace(device=H200, work=work, batch=batch, folder="f", model="m", measured_tpot=0.0)
        roof = max(work.flops / H200.peak_flops["bf16"], work.bytes / H200.bandwidth)
        run.roofline_seconds = lambda roof=roof: roof
        run.measured_tpot = roof + 0.005 + 0.0002 * batch
        runs.append(run)
    overhead = fit_overhead(runs)
    assert overhead.base == pytest.approx(0.005) and overhead.per_sequence == pytest.approx(0.0002)
    assert all(abs(check.error) < 1e-9 for check in checks(runs, overhead))


def test_the_calibration_reproduces_the_committed_h200_run_within_its_stated_error():
    runs = committed_runs()
    h200 = [run for run in runs if run.folder == "h200-2026-12-04"]
    assert {(run.model.split(" ")[0], run.batch) for run in h200} == {("~200M", 1), ("~200M", 32), ("1.7B", 1),
                                                                     ("1.7B", 8)}
    assert all(run.device is H200 for run in h200)
    measured = {(run.model.split(" ")[0], run.batch): run.measured_tpot for run in h200}
    assert measured[("~200M", 1)] == pytest.approx(0.011721, rel=1e-4)  # gpu_check.json, speculative off
    assert measured[("1.7B", 1)] == pytest.approx(0.012691, rel=1e-4)   # decode_1.7b_levels.log, level none
    overhead, found = calibration()
    assert 0.010 < overhead.base < 0.0125 and 0 < overhead.per_sequence < 0.0005  # ~11 ms a step, as observed
    assert len(found) == len(runs) and all(abs(check.error) <= H200_ERROR for check in found)
    # the roofline alone would be ~18x off: the overhead is what the projection adds
    assert all(run.measured_tpot > 15 * run.roofline_seconds() for run in h200)
    text = describe_calibration()
    assert "NVIDIA H200, h200-2026-12-04: ~200M Llama (12 layers) | 1 | 11.72 |" in text


def test_the_docs_quote_the_fit_and_its_errors():
    """docs/roofline.md states the overhead and each committed point's error: they cannot drift from the fit."""
    text = (PROJECT_ROOT / "docs" / "roofline.md").read_text(encoding="utf-8")
    overhead, found = calibration()
    assert f"GPU overhead = {1e3 * overhead.base:.2f} ms + {1e3 * overhead.per_sequence:.3f} ms" in text
    for check in found:
        model = check.run.split(": ", 1)[1]
        row = (f"| {model} | {check.batch} | {1e3 * check.measured_seconds:.2f} | {1e3 * check.projected_seconds:.2f} "
               f"| {check.error:+.1%} |")
        assert row in text, row
    worst = max(abs(check.error) for check in found)
    assert worst <= H200_ERROR and f"within ±{H200_ERROR:.0%}" in text
