"""Memory estimates made before loading match what the loaded engine reports."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, estimate_memory
from tests.support.reference_figures import checkpoint_bytes, kv_bytes_per_token

KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # K and V x 2 layers x 2 KV heads x head_dim 16 x float32 (llama-gqa)


@pytest.mark.parametrize("settings, kv_tokens", [
    (dict(), 32 * 512),  # unset: max_num_seqs (32) sequences of max_model_len (the model's 512 positions)
    (dict(kv_cache_bytes=3 * 2**20, block_size=8), 3 * 2**20 // KV_BYTES_PER_TOKEN),
    (dict(kv_layout="contiguous", prefix_caching=False, max_model_len=128, max_num_seqs=3), 3 * 128),
])
def test_estimate_matches_the_loaded_engine(tiny_llama_dir, settings, kv_tokens):
    config = EngineConfig(model=tiny_llama_dir, dtype="float32", **settings)
    estimate = estimate_memory(config)
    with Engine(config) as engine:
        stats = engine.stats()
    assert kv_bytes_per_token(tiny_llama_dir, 4) == KV_BYTES_PER_TOKEN
    assert estimate.weights_bytes == stats.weights_bytes == checkpoint_bytes(tiny_llama_dir)
    assert estimate.kv_cache_bytes == stats.kv_cache_bytes == kv_tokens * KV_BYTES_PER_TOKEN
    assert estimate.total_bytes == stats.weights_bytes + stats.kv_cache_bytes


def test_estimate_follows_dtype(tiny_llama_dir):
    full = estimate_memory(EngineConfig(model=tiny_llama_dir, dtype="float32", kv_cache_bytes=2**20))
    half = estimate_memory(EngineConfig(model=tiny_llama_dir, dtype="bfloat16", kv_cache_bytes=2**20))
    assert half.weights_bytes * 2 == full.weights_bytes
