"""The decode profile: steps timed in place against their matmul floor, through the API and the bench CLI."""

from __future__ import annotations

import json
import time

import pytest

from engine import DecodeProfile, Engine, EngineConfig, RequestError, SamplingParams
from engine.runner.profiler import _interpolate, measure_matmul_floor
from engine.testing import EngineProbe
from engine.tools.bench import main

PROMPTS = [[5 + i] * 30 for i in range(10)]  # more sequences than the fused small-batch decode takes


def profile_of(folder: str, prompts=PROMPTS, **settings) -> DecodeProfile:
    with Engine(EngineConfig(model=folder, dtype="float32", **settings)) as engine:
        started = time.perf_counter()
        engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
        profile = engine.decode_profile(since=started)
        assert engine.decode_profile(since=time.perf_counter()) is None  # no decode step after `since`
    return profile


def test_profile_relates_decode_steps_to_their_floor(tiny_llama_dir):
    profile = profile_of(tiny_llama_dir)
    assert profile.steps >= 10 and profile.mean_batch_size == pytest.approx(10, abs=1)
    assert 30 < profile.mean_context_len < 42
    assert 0 < profile.lm_head_floor_ms < profile.floor_ms
    # medians of per-step ratios: close to the ratio of the medians when the batch hardly changes
    assert profile.floor_ratio == pytest.approx(profile.step_ms / profile.floor_ms, rel=0.25)
    assert profile.cpu_floor_ratio == pytest.approx(profile.cpu_step_ms / profile.cpu_floor_ms, rel=0.25)
    assert sum(profile.shares.values()) == pytest.approx(1.0)
    assert {"attention", "kv_write", "lm_head", "sample", "schedule", "layers"} <= set(profile.shares)
    assert "kv_gather" not in profile.shares  # the paged kernel reads the pool in place
    # no step allocates fresh large temporaries: 64 faults is 256 KiB of new pages a step (about 3 are seen here)
    assert profile.minor_faults_per_step < 64
    assert "step / floor" in profile.format()
    small = profile_of(tiny_llama_dir, PROMPTS[:4])  # a few sequences: the decoder layers are one kernel call
    assert small.shares["fused_layers"] > 0 and "attention" not in small.shares


def test_the_padded_fallback_shows_its_gathers(tiny_llama_dir):
    profile = profile_of(tiny_llama_dir, attention="sdpa")
    assert profile.shares["kv_gather"] > 0


def test_floor_grows_with_the_batch_and_interpolates_between_measured_sizes(tiny_llama_dir):
    with Engine(EngineConfig(model=tiny_llama_dir, dtype="float32")) as engine:
        model = EngineProbe(engine).model()
        small, large = measure_matmul_floor(model, 1), measure_matmul_floor(model, 512)
    assert large.cpu_seconds > small.cpu_seconds
    assert _interpolate({1: 1.0, 5: 3.0}, 3) == pytest.approx(2.0)
    assert _interpolate({1: 1.0, 5: 3.0}, 9) == pytest.approx(3.0)


def test_transformers_backend_has_no_profile_and_a_closed_engine_refuses(tiny_llama_dir):
    engine = Engine(EngineConfig(model=tiny_llama_dir, backend="hf", dtype="float32"))
    engine.generate(PROMPTS[:2], SamplingParams(max_tokens=4, ignore_eos=True))
    assert engine.decode_profile() is None
    engine.close()
    with pytest.raises(RequestError, match="closed"):
        engine.decode_profile()


def test_bench_profile_and_interleaved_rounds(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "profile.json"
    code = main(["--set", f"model={tiny_llama_dir}", "--num-prompts", "4", "--input-len", "16", "--output-len", "12",
                 "--profile", "--compare", "continuous", "--compare-set", "cpu_kernels=false", "--rounds", "2",
                 "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.count("decode profile:") == 2 and "per round" in printed
    report = json.loads(out.read_text())
    assert report["decode_profile"]["steps"] > 0 and report["compare"]["decode_profile"]["steps"] > 0
    assert report["cpu_ms_per_output_token"] > 0
    assert len(report["round_ratios"]) == 2
    assert report["compare"]["attention"] == "sdpa" and report["attention"] == "cpu-kernel"
