"""GPU-only paths of the native engine: flash-attn over the paged cache and CUDA-graph decode steps.

Skipped without CUDA (and without flash_attn for the kernels that need it); `python -m engine.gpu_check`
runs the same checks with timings on a GPU machine.
"""

from __future__ import annotations

import importlib.util

import pytest

from engine import Engine, EngineConfig, SamplingParams

pytestmark = pytest.mark.gpu
needs_flash = pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="flash_attn not installed")
PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 300)), [3] * 40, [100, 200, 300, 17]]


def greedy(folder: str, dtype: str = "float32", **settings) -> list[list[int]]:
    with Engine(EngineConfig(model=folder, device="cuda", dtype=dtype, **settings)) as engine:
        outputs = engine.generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
        return [o.token_ids for o in outputs]


def test_sdpa_on_cuda_matches_cpu(tiny_llama_dir):
    with Engine(EngineConfig(model=tiny_llama_dir, device="cpu")) as engine:
        cpu = [o.token_ids for o in engine.generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))]
    assert greedy(tiny_llama_dir, attention="sdpa") == cpu


@needs_flash
@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_flash_attn_matches_sdpa(tiny_llama_dir, cuda_graphs):
    """flash-attn computes in bfloat16, where rounding may flip a rare near-tie: demand 95% agreement."""
    reference = greedy(tiny_llama_dir, "bfloat16", attention="sdpa")
    flash = greedy(tiny_llama_dir, "bfloat16", attention="flash-attn", block_size=256, cuda_graphs=cuda_graphs)
    pairs = [(a, b) for ref, out in zip(reference, flash, strict=True) for a, b in zip(ref, out, strict=True)]
    assert sum(a == b for a, b in pairs) / len(pairs) >= 0.95


@needs_flash
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_cuda_graphs_setting_turns_graph_decode_on_and_off(tiny_llama_dir, cuda_graphs):
    with Engine(EngineConfig(model=tiny_llama_dir, device="cuda", dtype="bfloat16", attention="flash-attn",
                             block_size=256, cuda_graphs=cuda_graphs)) as engine:
        assert engine.info.cuda_graphs is cuda_graphs
        assert engine.generate([1, 2, 3], SamplingParams(max_tokens=8))[0].token_ids


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "bfloat16"])
def test_a_quantized_kv_pool_on_cuda_reads_like_the_cpus(tiny_llama_dir, kv_cache_dtype):
    """The GPU's sdpa path dequantizes on gather the same pool format the CPU's paths read: same greedy tokens as
    the CPU's pure-PyTorch path over the same pool (not yet run on a GPU)."""
    settings = dict(attention="sdpa", kv_cache_dtype=kv_cache_dtype)
    with Engine(EngineConfig(model=tiny_llama_dir, device="cpu", cpu_kernels=False, **settings)) as engine:
        cpu = [o.token_ids for o in engine.generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))]
    assert greedy(tiny_llama_dir, **settings) == cpu
