"""Memory estimates made before loading match what the loaded engine reports."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, estimate_memory


@pytest.mark.parametrize("settings", [
    dict(),
    dict(kv_cache_bytes=3 * 2**20, block_size=8),
    dict(kv_layout="contiguous", prefix_caching=False, max_model_len=128, max_num_seqs=3),
])
def test_estimate_matches_the_loaded_engine(tiny_llama_dir, settings):
    config = EngineConfig(model=tiny_llama_dir, dtype="float32", **settings)
    estimate = estimate_memory(config)
    with Engine(config) as engine:
        stats = engine.stats()
    assert estimate.weights_bytes == stats["weights_bytes"]
    assert estimate.kv_cache_bytes == stats["kv_cache_bytes"]
    assert estimate.total_bytes == stats["weights_bytes"] + stats["kv_cache_bytes"]


def test_estimate_follows_dtype(tiny_llama_dir):
    full = estimate_memory(EngineConfig(model=tiny_llama_dir, dtype="float32", kv_cache_bytes=2**20))
    half = estimate_memory(EngineConfig(model=tiny_llama_dir, dtype="bfloat16", kv_cache_bytes=2**20))
    assert half.weights_bytes * 2 == full.weights_bytes
