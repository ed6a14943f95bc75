"""The roofline: ceilings measured once and cached, step work from the model's shapes, phases placed by intensity."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace

import pytest
from transformers import AutoModelForCausalLM

from engine import Engine, EngineConfig, SamplingParams
from engine.hub import load_hf_config
from engine.model.spec import ModelSpec
from engine.tools.bench import main
from engine.tools.roofline import (
    OVERHEAD_BELOW,
    DeviceCeilings,
    ModelWork,
    StepWork,
    analyze,
    ceilings_key,
    device_ceilings,
    engine_roofline,
    measure_ceilings,
)
from tests.support.roofline_steps import decode_step, prefill_step

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FAKE = DeviceCeilings(device="test device", dtype="float32", threads=1, peak_flops=1e12, bandwidth=1e10,
                      matmul_size=8, bandwidth_bytes=8, measured_at="2026-01-01T00:00:00Z", seconds=0.0)


@pytest.fixture(scope="module")
def tiny_work(tiny_llama_dir) -> tuple[ModelSpec, ModelWork]:
    spec = ModelSpec.from_hf_config(load_hf_config(tiny_llama_dir))
    weights = 4 * (spec.num_layers * 10_000 + 2 * spec.vocab_size * spec.hidden_size)
    return spec, ModelWork.of(spec, weights, kv_bytes_per_token=2 * spec.num_layers * spec.num_kv_heads
                              * spec.head_dim * 4, dtype="float32")


def test_work_coefficients_match_the_checkpoint(tiny_llama_dir, tiny_work):
    """FLOPs per token are 2 x the linear weights transformers' own model holds; per pair 4 x heads x head_dim."""
    spec, work = tiny_work
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    linear_params = sum(p.numel() for name, p in model.named_parameters()
                        if name.endswith(".weight") and any(part in name for part in LINEAR_NAMES))
    assert work.linear_flops_per_token == 2 * linear_params
    assert work.lm_head_flops_per_row == 2 * model.lm_head.weight.numel()
    assert work.attention_flops_per_pair == 4 * spec.num_heads * spec.head_dim * spec.num_layers
    # untied embeddings: the table is not read whole each step, only one row per token
    assert work.weight_bytes_per_step == 4 * (spec.num_layers * 10_000 + spec.vocab_size * spec.hidden_size)


def test_step_work_sums_weights_kv_and_attention(tiny_work):
    _, work = tiny_work
    step = decode_step(batch=3, context=40)
    counted = StepWork.of(step, work)
    assert counted.flops == 3 * (work.linear_flops_per_token + work.lm_head_flops_per_row) + 120 * (
        work.attention_flops_per_pair)
    assert counted.bytes == (work.weight_bytes_per_step + 120 * work.kv_bytes_per_token + 3 * work.kv_bytes_per_token
                             + 3 * (work.embedding_bytes_per_token + work.logits_bytes_per_row))


def test_decode_intensity_grows_with_batch_size_and_prefill_is_right_of_it(tiny_work):
    _, work = tiny_work
    steps = [decode_step(batch, 64) for batch in (1, 1, 4, 16, 64)] + [prefill_step(256)]
    report = analyze(steps, work, FAKE)
    intensities = [point.intensity for point in report.decode_by_batch]
    assert [point.phase for point in report.decode_by_batch] == [f"decode, batch {b}" for b in (1, 4, 16, 64)]
    assert intensities == sorted(intensities) and intensities[-1] > 4 * intensities[0]
    assert report.prefill.intensity > intensities[-1]
    assert report.decode.steps == 5 and report.prefill.steps == 1


def test_bound_and_fraction_follow_the_ridge(tiny_work):
    """Left of the ridge a phase is memory-bound and its fraction is bytes/s over the bandwidth; right of it,
    compute-bound and FLOP/s over the peak."""
    _, work = tiny_work
    decode = StepWork.of(decode_step(2, 32), work)
    ridge_above = replace(FAKE, peak_flops=decode.flops / decode.bytes * FAKE.bandwidth * 10)
    report = analyze([decode_step(2, 32, seconds=0.5)], work, ridge_above)
    assert report.decode.bound == "memory"
    assert report.decode.fraction_of_ceiling == pytest.approx(decode.bytes / 0.5 / ridge_above.bandwidth)
    ridge_below = replace(FAKE, peak_flops=decode.flops / decode.bytes * FAKE.bandwidth / 10)
    report = analyze([decode_step(2, 32, seconds=0.5)], work, ridge_below)
    assert report.decode.bound == "compute"
    assert report.decode.fraction_of_ceiling == pytest.approx(decode.flops / 0.5 / ridge_below.peak_flops)
    assert report.decode.verdict == ("compute-bound" if report.decode.fraction_of_ceiling >= OVERHEAD_BELOW
                                     else "neither bound: overhead")
    assert report.decode.verdict in report.summary()[0] and "of its ceiling" in report.summary()[0]


@pytest.mark.parametrize("fraction, verdict", [(0.08, "neither bound: overhead"), (0.27, "neither bound: overhead"),
                                               (0.5, "memory-bound"), (0.9, "memory-bound")])
def test_a_phase_far_below_its_roof_is_called_overhead_not_memory_bound(tiny_work, fraction, verdict):
    _, work = tiny_work
    decode = StepWork.of(decode_step(2, 32), work)
    ridge_above = replace(FAKE, peak_flops=decode.flops / decode.bytes * FAKE.bandwidth * 10)
    seconds = decode.bytes / (ridge_above.bandwidth * fraction)
    report = analyze([decode_step(2, 32, seconds=seconds)], work, ridge_above)
    assert report.decode.bound == "memory" and report.decode.fraction_of_ceiling == pytest.approx(fraction)
    assert report.decode.verdict == verdict and f"is {verdict}" in report.summary()[0]


def test_ceilings_are_measured_once_then_read_from_the_cache(tmp_path):
    path = tmp_path / "ceilings.json"
    calls = []

    def measure(device, dtype):
        calls.append((device, dtype))
        return replace(FAKE, dtype=dtype)

    first = device_ceilings("cpu", "float32", cache_path=path, measure=measure)
    second = device_ceilings("cpu", "float32", cache_path=path, measure=measure)
    assert calls == [("cpu", "float32")]
    assert first.source == "measured" and second.source == "cache"
    assert asdict(replace(second, source="measured")) == asdict(first)
    assert ceilings_key("cpu", "float32") in json.loads(path.read_text())
    device_ceilings("cpu", "bfloat16", cache_path=path, measure=measure)  # another dtype: its own entry
    refreshed = device_ceilings("cpu", "float32", cache_path=path, measure=measure, refresh=True)
    assert calls == [("cpu", "float32"), ("cpu", "bfloat16"), ("cpu", "float32")]
    assert refreshed.runs == 2 and refreshed.source == "measured"
    path.write_text("not json")
    assert device_ceilings("cpu", "float32", cache_path=path, measure=measure).source == "measured"


def test_measuring_again_keeps_the_best_of_each_ceiling(tmp_path):
    path = tmp_path / "ceilings.json"
    results = iter([replace(FAKE, peak_flops=2e11, bandwidth=1e10), replace(FAKE, peak_flops=1e11, bandwidth=3e10)])
    device_ceilings("cpu", "float32", cache_path=path, measure=lambda device, dtype: next(results))
    best = device_ceilings("cpu", "float32", cache_path=path, refresh=True, measure=lambda device, dtype: next(results))
    assert (best.peak_flops, best.bandwidth, best.runs) == (2e11, 3e10, 2)
    assert device_ceilings("cpu", "float32", cache_path=path, measure=None).peak_flops == 2e11


def test_measured_ceilings_are_plausible_for_a_cpu():
    ceilings = measure_ceilings("cpu", "float32")
    assert 1e8 < ceilings.peak_flops < 1e14 and 1e8 < ceilings.bandwidth < 1e13
    assert ceilings.ridge_intensity == ceilings.peak_flops / ceilings.bandwidth


def test_engine_records_what_each_step_attends(tiny_llama_dir, tmp_path):
    """One 10-token prompt, 4 tokens out: the prefill step attends 10 positions with 55 causal pairs, each
    decode step its whole context once; the report places both phases."""
    with Engine(EngineConfig(model=tiny_llama_dir)) as engine:
        since = time.perf_counter()
        engine.generate([list(range(3, 13))], SamplingParams(max_tokens=4, ignore_eos=True))
        steps = engine.step_history(since)
        assert [(s.num_tokens, s.context_tokens, s.attention_pairs) for s in steps] == [
            (10, 10, 55), (1, 11, 11), (1, 12, 12), (1, 13, 13)]
        report = engine_roofline(engine, since, cache_path=tmp_path / "c.json")
    assert report.prefill.tokens == 10 and report.decode.tokens == 3
    assert report.prefill.intensity > report.decode.intensity


def test_transformers_backend_is_refused_with_its_reason(tiny_llama_dir, tmp_path):
    with Engine(EngineConfig(model=tiny_llama_dir, backend="hf")) as engine:
        with pytest.raises(ValueError, match="transformers backend"):
            engine_roofline(engine, cache_path=tmp_path / "c.json")


def test_bench_report_carries_the_roofline(tiny_llama_dir, tmp_path, device_ceilings_cache, capsys):
    """The bench reads the cached ceilings and reports each phase's intensity, bound and fraction."""
    cached = json.loads(device_ceilings_cache.read_text()) if device_ceilings_cache.exists() else {}
    cached[ceilings_key("cpu", "float32")] = asdict(FAKE) | {"device": "cached test ceilings"}
    cached[ceilings_key("cpu", "float32")].pop("source")
    device_ceilings_cache.write_text(json.dumps(cached))
    out = tmp_path / "bench.json"
    assert main(["--set", f"model={tiny_llama_dir}", "--num-prompts", "2", "--input-len", "8", "--output-len", "4",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["device_peak_flops"] == FAKE.peak_flops and report["device_bandwidth"] == FAKE.bandwidth
    assert report["roofline"]["ceilings"]["source"] == "cache"
    # every token the run computed, in one phase or the other (a step that prefills one prompt while another
    # request decodes counts as prefill): 2 prompts of 8, then 3 more tokens each (the 4th is never fed back)
    prefill, decode = report["roofline"]["prefill"], report["roofline"]["decode"]
    assert decode["steps"] > 0 and prefill["tokens"] >= 16 and prefill["tokens"] + decode["tokens"] == 2 * 8 + 2 * 3
    assert report["roofline_decode_bound"] == "memory"  # tiny intensity against a ridge of 100 FLOP/byte
    assert 0 < report["roofline_decode_fraction"] and report["roofline_prefill_intensity"] > 0
    assert "cached test ceilings" in capsys.readouterr().out
    assert main(["--set", f"model={tiny_llama_dir}", "--num-prompts", "1", "--output-len", "2", "--no-roofline",
                 "--json", str(out)]) == 0
    assert "roofline" not in json.loads(out.read_text())



def test_bench_prints_the_cached_ceilings(device_ceilings_cache, capsys):
    cached = json.loads(device_ceilings_cache.read_text()) if device_ceilings_cache.exists() else {}
    cached[ceilings_key("cpu", "bfloat16")] = {k: v for k, v in asdict(FAKE).items() if k != "source"} | {
        "dtype": "bfloat16"}
    device_ceilings_cache.write_text(json.dumps(cached))
    assert main(["--ceilings", "--set", "dtype=bfloat16"]) == 0
    printed = capsys.readouterr().out
    assert "matmul peak 1000.0 GFLOP/s" in printed and "memory read 10.0 GB/s" in printed
    assert "from the cache" in printed
