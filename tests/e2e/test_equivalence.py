"""The native engine's greedy output equals transformers' token for token, in float32.

Every architecture, under both batching modes, both KV layouts, prefix caching on and off,
chunked prefill, every CPU attention backend (the engine's paged kernel by default, sdpa and eager),
the pure-PyTorch paths (cpu_kernels=False), and with preemption forced by a KV budget of one
max-length sequence.
"""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from tests.support.greedy_reference import MAX_TOKENS, PROMPTS, hf_greedy
from tests.support.reference_figures import kv_bytes_per_token
from tests.support.tiny_models import TINY_ARCHITECTURES


@pytest.fixture(scope="module")
def references(tiny_model_dirs) -> dict[str, list[list[int]]]:
    return {name: hf_greedy(folder, PROMPTS, MAX_TOKENS) for name, folder in tiny_model_dirs.items()}


def run_native(folder: str, prompts=PROMPTS, max_tokens=MAX_TOKENS, **settings):
    with Engine(EngineConfig(model=folder, dtype="float32", **settings)) as engine:
        outputs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        return [o.token_ids for o in outputs], engine.stats()


SETTINGS = {
    "continuous-paged-prefix": dict(batching="continuous", kv_layout="paged", prefix_caching=True, block_size=8),
    "continuous-paged": dict(batching="continuous", kv_layout="paged", prefix_caching=False, block_size=16),
    "continuous-contiguous": dict(batching="continuous", kv_layout="contiguous", prefix_caching=False),
    "static-paged-prefix": dict(batching="static", kv_layout="paged", prefix_caching=True, max_num_seqs=3),
    "static-contiguous": dict(batching="static", kv_layout="contiguous", prefix_caching=False, max_num_seqs=4),
    "chunked-prefill": dict(max_num_batched_tokens=16, block_size=4),
    "eager-attention": dict(attention="eager"),
    "sdpa-attention": dict(attention="sdpa"),
    "pure-pytorch": dict(cpu_kernels=False, max_num_batched_tokens=16, block_size=4),
}


@pytest.mark.parametrize("arch", list(TINY_ARCHITECTURES))
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_matches_transformers(arch, setting, tiny_model_dirs, references):
    tokens, _ = run_native(tiny_model_dirs[arch], **SETTINGS[setting])
    assert tokens == references[arch]


def one_sequence_budget(folder: str, max_model_len: int, block_size: int) -> int:
    return -(-max_model_len // block_size) * block_size * kv_bytes_per_token(folder, 4)


@pytest.mark.parametrize("arch", ["llama-gqa", "qwen3-qk-norm"])
@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_preemption_under_tiny_kv_budget_keeps_outputs(arch, layout, tiny_model_dirs, references):
    """A pool of about one max-length sequence forces preemption; recomputation must not change tokens."""
    max_model_len = 80
    block_size = 4 if layout == "paged" else max_model_len
    budget = one_sequence_budget(tiny_model_dirs[arch], max_model_len, block_size)
    tokens, stats = run_native(tiny_model_dirs[arch], max_model_len=max_model_len, kv_cache_bytes=budget,
                               kv_layout=layout, prefix_caching=layout == "paged", block_size=4)
    assert tokens == references[arch]
    if layout == "paged":
        assert stats.num_preemptions > 0
    assert stats.peak_running >= 1
    assert stats.kv_blocks_free == stats.kv_blocks_total
