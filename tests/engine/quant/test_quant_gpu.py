"""GPU-only: quantization levels on CUDA (bitsandbytes, torchao int4, quanto). Skipped without CUDA.

The checkpoint is a random Llama whose every input width is a multiple of 128, so that each CUDA level takes all
its layers (torchao's int4 refuses the demo model's 704-wide down projection with a ConfigError). Levels whose
library is not installed are left out, not failed. First run on an H200 on 2026-12-04 (see the README).
"""

from __future__ import annotations

import math

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams, estimate_memory
from engine.quant.levels import LEVELS
from tests.support.tiny_models import build_tiny_chat_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA_LEVELS = [name for name, level in LEVELS.items() if "cuda" in level.devices and level.installed()]
FOUR_BIT_CUDA_LEVELS = [name for name in CUDA_LEVELS if name in ("nf4", "fp4", "torchao-int4", "quanto-int4")]
SHAPE = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4)


@pytest.fixture(scope="module")
def quantizable_chat_dir(tmp_path_factory) -> str:
    return build_tiny_chat_model(tmp_path_factory.mktemp("quantizable-chat"), **SHAPE)


@pytest.mark.parametrize("level", CUDA_LEVELS)
def test_cuda_level_reports_the_bytes_it_estimated(quantizable_chat_dir, level):
    config = EngineConfig(model=quantizable_chat_dir, device="cuda", dtype="bfloat16", quantization=level,
                          max_model_len=256, kv_cache_bytes=2**22)
    estimate = estimate_memory(config)
    full = estimate_memory(EngineConfig(model=quantizable_chat_dir, device="cuda", dtype="bfloat16",
                                        max_model_len=256, kv_cache_bytes=2**22)).weights_bytes
    with Engine(config) as engine:
        engine.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))
        assert engine.stats().weights_bytes == estimate.weights_bytes < full
        assert math.isfinite(engine.perplexity().perplexity)


@pytest.mark.parametrize("level", FOUR_BIT_CUDA_LEVELS)
def test_full_precision_weights_never_sit_on_the_gpu_at_once(quantizable_chat_dir, level):
    full = estimate_memory(EngineConfig(model=quantizable_chat_dir, device="cuda", dtype="bfloat16",
                                        max_model_len=64, kv_cache_bytes=2**20)).weights_bytes
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with Engine(EngineConfig(model=quantizable_chat_dir, device="cuda", dtype="bfloat16", quantization=level,
                             max_model_len=64, kv_cache_bytes=2**20)):
        peak = torch.cuda.max_memory_allocated() - before
    assert peak < full


@pytest.mark.skipif("torchao-int4" not in CUDA_LEVELS, reason="torchao not installed")
def test_torchao_int4_follows_bfloat16_output(quantizable_chat_dir):
    prompts = [[{"role": "user", "content": "Paged attention stores keys and values in blocks."}]]
    outputs = {}
    for level in ("none", "torchao-int4"):
        with Engine(EngineConfig(model=quantizable_chat_dir, device="cuda", dtype="bfloat16", quantization=level,
                                 kv_cache_bytes=2**24)) as engine:
            outputs[level] = engine.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))[0].token_ids
    assert outputs["torchao-int4"][:2] == outputs["none"][:2]
