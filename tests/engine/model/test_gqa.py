"""GQA / MQA conversion (`gqa`): the KV cache follows the head count; `mha` changes no output.

The demo target is multi-head (8 query heads, 8 KV heads): converting it to 4, 2 or 1 KV heads
(mean-pooled groups) shrinks what one token costs in the cache and lets more blocks fit the same
`kv_cache_bytes`. Random GQA checkpoints expanded to one KV head per query head (`mha`) must give
greedy outputs identical to their native heads.
"""

from __future__ import annotations

import json

import pytest
import torch

from engine import ConfigError, Engine, EngineConfig, SamplingParams, choice_note, estimate_memory
from engine.hub import resolve_model_path
from engine.model.gqa import kv_head_options, regroup_kv_heads

KV_BYTES = 32 * 2**20


# The bundled target's depth (its hidden size 256 and 8 heads of 32 are what these figures check).
DEMO_LAYERS = json.loads((resolve_model_path("demo") / "config.json").read_text())["num_hidden_layers"]


@pytest.fixture(scope="module")
def demo_kv_figures() -> dict:
    """KV heads -> (bytes per token, blocks in KV_BYTES, estimate) for the demo target."""
    figures = {}
    for heads in (8, 4, 2, 1):
        config = EngineConfig(model="demo", dtype="float32", gqa=heads, kv_cache_bytes=KV_BYTES)
        with Engine(config) as engine:
            figures[heads] = (engine.info.kv_bytes_per_token, engine.stats().kv_blocks_total,
                              engine.info.num_kv_heads, estimate_memory(config))
    return figures


def test_kv_bytes_per_token_scale_exactly_with_kv_heads(demo_kv_figures):
    per_token_8 = demo_kv_figures[8][0]
    assert per_token_8 == 2 * DEMO_LAYERS * 8 * 32 * 4  # K and V per layer, 8 heads of 32 float32 values
    for heads, (per_token, _, kv_heads, _) in demo_kv_figures.items():
        assert kv_heads == heads
        assert per_token * 8 == per_token_8 * heads


def test_blocks_that_fit_grow_as_kv_heads_shrink(demo_kv_figures):
    block_size = EngineConfig().block_size
    for per_token, blocks, _, estimate in demo_kv_figures.values():
        assert blocks == KV_BYTES // (block_size * per_token)
        assert (estimate.kv_blocks, estimate.kv_bytes_per_token) == (blocks, per_token)
    assert demo_kv_figures[1][1] >= 8 * demo_kv_figures[8][1]


def test_estimated_weights_follow_the_kv_projection(demo_kv_figures):
    """Fewer KV heads also mean smaller K and V projections: layers x 2 x 256 inputs x 32 per head."""
    weights = {heads: figures[3].weights_bytes for heads, figures in demo_kv_figures.items()}
    for heads in (4, 2, 1):
        assert weights[8] - weights[heads] == DEMO_LAYERS * 2 * 256 * 32 * (8 - heads) * 4


@pytest.mark.parametrize("name", ["llama-gqa", "llama-mqa-tied", "qwen2-qkv-bias", "qwen3-qk-norm"])
def test_mha_expansion_gives_identical_greedy_output(tiny_model_dirs, name):
    prompts = [[5, 17, 99, 3, 250, 8], [11, 12], list(range(40, 70))]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    outputs = {}
    for gqa in ("native", "mha"):
        with Engine(EngineConfig(model=tiny_model_dirs[name], dtype="float32", gqa=gqa)) as engine:
            outputs[gqa] = [o.token_ids for o in engine.generate(prompts, params)]
            kv_heads = engine.info.num_kv_heads
    assert kv_heads == 4  # every query head has its own KV head now
    assert outputs["mha"] == outputs["native"]


def test_pooling_changes_outputs(tiny_model_dirs):
    """A conversion that pools heads is not a no-op (the quality it costs shows in perplexity)."""
    prompts = [[5, 17, 99, 3, 250, 8], list(range(40, 70))]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    outputs = {}
    for gqa in ("native", 1):
        with Engine(EngineConfig(model=tiny_model_dirs["llama-gqa"], dtype="float32", gqa=gqa)) as engine:
            outputs[gqa] = [o.token_ids for o in engine.generate(prompts, params)]
    assert outputs[1] != outputs["native"]


def test_regroup_pools_by_mean_and_repeats_whole_heads():
    heads = torch.arange(4 * 3 * 2, dtype=torch.float32).reshape(4 * 3, 2)  # 4 heads of dim 3, 2 inputs
    pooled = regroup_kv_heads(heads, 4, 2)
    assert torch.equal(pooled[:3], (heads[0:3] + heads[3:6]) / 2)
    assert torch.equal(pooled[3:], (heads[6:9] + heads[9:12]) / 2)
    expanded = regroup_kv_heads(heads, 4, 8)
    assert torch.equal(expanded[:6], torch.cat([heads[:3], heads[:3]]))
    assert torch.equal(regroup_kv_heads(expanded, 8, 4), heads)


def test_impossible_head_counts_are_refused_with_the_options():
    assert kv_head_options(8, 8) == [1, 2, 4, 8]
    assert kv_head_options(4, 2) == [1, 2, 4]
    with pytest.raises(ConfigError, match="gqa=3.*one of 1, 2, 4, 8"):
        Engine(EngineConfig(model="demo", gqa=3))
    with pytest.raises(ConfigError, match="native engine only"):
        EngineConfig(model="demo", backend="hf", gqa=2).validate()


def test_gqa_choices_carry_a_note():
    assert "same outputs" in choice_note("gqa", "mha")
    assert "mean-pooling" in choice_note("gqa", 2)
    assert choice_note("gqa", "native") is None
