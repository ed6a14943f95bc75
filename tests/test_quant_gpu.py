"""GPU-only: quantization levels on CUDA (bitsandbytes, torchao int4, quanto). Skipped without CUDA.

Unverified here (no GPU in the sessions that wrote it): these run where `pytest` finds CUDA.
"""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams, estimate_memory
from engine.quant.levels import LEVELS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA_LEVELS = [name for name, level in LEVELS.items() if "cuda" in level.devices and level.installed()]


@pytest.mark.parametrize("level", CUDA_LEVELS)
def test_cuda_level_reports_the_bytes_it_estimated(level):
    config = EngineConfig(model="demo", device="cuda", dtype="bfloat16", quantization=level, max_model_len=256,
                          kv_cache_bytes=2**22)
    estimate = estimate_memory(config)
    with Engine(config) as engine:
        engine.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))
        assert engine.stats()["weights_bytes"] == estimate.weights_bytes
        assert engine.perplexity().perplexity < 1000


def test_full_precision_weights_never_sit_on_the_gpu_at_once():
    full = estimate_memory(EngineConfig(model="demo", device="cuda", dtype="bfloat16", max_model_len=64,
                                        kv_cache_bytes=2**20)).weights_bytes
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with Engine(EngineConfig(model="demo", device="cuda", dtype="bfloat16", quantization="nf4", max_model_len=64,
                             kv_cache_bytes=2**20)):
        peak = torch.cuda.max_memory_allocated() - before
    assert peak < full


def test_torchao_int4_follows_bfloat16_output():
    prompts = [[{"role": "user", "content": "What does the json module do?"}]]
    outputs = {}
    for level in ("none", "torchao-int4"):
        with Engine(EngineConfig(model="demo", device="cuda", dtype="bfloat16", quantization=level,
                                 kv_cache_bytes=2**24)) as engine:
            outputs[level] = engine.generate(prompts, SamplingParams(max_tokens=16))[0].token_ids
    assert outputs["torchao-int4"][:2] == outputs["none"][:2]
