"""`kv_cache_dtype`: what the KV pool stores, what that buys (tokens per byte of KV budget) and what it costs (output
drift), on every attention path that reads the pool, and the configurations that refuse it."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from engine import ConfigError, Engine, EngineConfig, SamplingParams, estimate_memory
from engine import plan as planning
from engine.testing import EngineProbe
from engine.tools.bench import resolve_bench_model

# random-llama-20m: 4 layers, 4 KV heads of 64 values; K and V per token
LAYERS, KV_HEADS, HEAD_DIM = 4, 4, 64
PER_TOKEN = {"float32": 2 * LAYERS * KV_HEADS * HEAD_DIM * 4, "bfloat16": 2 * LAYERS * KV_HEADS * HEAD_DIM * 2,
             "int8": 2 * LAYERS * KV_HEADS * (HEAD_DIM + 4)}
BUDGET, BLOCK = 2**23, 16
PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time", "What is a KV cache?"]
GREEDY = SamplingParams(max_tokens=32, ignore_eos=True)


def test_an_int8_pool_holds_over_3_5x_the_tokens_of_float32_on_random_llama_20m():
    """68 bytes per 64 values (int8 and a float32 scale) against 256: 3.76x the tokens, and the blocks, of one KV
    budget; the pool tensor, `info`, `stats()` and `estimate_memory` all say so."""
    model = resolve_bench_model("random-llama-20m")
    blocks = {}
    for kv_cache_dtype, per_token in PER_TOKEN.items():
        config = EngineConfig(model=model, kv_cache_dtype=kv_cache_dtype, kv_cache_bytes=BUDGET, max_model_len=256)
        estimate = estimate_memory(config)
        with Engine(config) as engine:
            info, stats, storage = engine.info, engine.stats(), EngineProbe(engine).kv_storage()
        assert info.kv_cache_dtype == kv_cache_dtype and info.dtype == "float32"
        assert info.kv_bytes_per_token == estimate.kv_bytes_per_token == per_token
        assert stats.kv_blocks_total == estimate.kv_blocks == BUDGET // (per_token * BLOCK)
        assert stats.kv_cache_bytes == estimate.kv_cache_bytes == storage.nbytes
        row = HEAD_DIM + 4 if kv_cache_dtype == "int8" else HEAD_DIM
        assert storage.dtype == getattr(torch, kv_cache_dtype)
        assert storage.shape == (2, LAYERS, KV_HEADS, stats.kv_blocks_total * BLOCK, row)
        blocks[kv_cache_dtype] = stats.kv_blocks_total
    assert blocks["int8"] / blocks["float32"] >= 3.5
    assert blocks["bfloat16"] == 2 * blocks["float32"]


NEAR_TIE = 0.01  # nats between float32's two most likely tokens: a lower-precision pool may pick either


@pytest.fixture(scope="module")
def float32_tokens() -> list[tuple[list[int], int]]:
    """Each prompt's float32 greedy tokens and how many of them come before its first near tie (where the two most
    likely tokens are within NEAR_TIE: "The capital of France is" starts with one on the 2026-12-07 target)."""
    with Engine(EngineConfig(model="demo", kv_cache_bytes=2**24)) as engine:
        outputs = engine.generate(PROMPTS, SamplingParams(max_tokens=GREEDY.max_tokens, ignore_eos=True, logprobs=2))
    runs = []
    for output in outputs:
        margins = [step.top[0][1] - step.top[1][1] for step in output.logprobs]
        runs.append((output.token_ids, next((i for i, m in enumerate(margins) if m < NEAR_TIE), len(margins))))
    return runs


@pytest.mark.parametrize("kv_cache_dtype, settings", [
    ("int8", dict()),                                            # the C++ kernel, and the fused decode
    ("bfloat16", dict()),
    ("int8", dict(attention="sdpa", cpu_kernels=False)),         # pure PyTorch: dequantize-on-gather
    ("bfloat16", dict(attention="eager", cpu_kernels=False)),
    ("int8", dict(kv_layout="contiguous", prefix_caching=False, max_model_len=256)),
    ("int8", dict(speculative="ngram")),                         # verification chunks over the quantized prefix
])
def test_greedy_output_over_a_quantized_pool_stays_with_float32(float32_tokens, kv_cache_dtype, settings):
    """The demo target's greedy tokens from an int8 or bfloat16 pool, up to each prompt's first near tie in float32
    (past it either token is right, and the rest follows from it): the first 8 as float32's, and at least 90% of
    them all (measured: all of them). Most of the tokens come before a near tie, so the check cannot empty."""
    config = EngineConfig(model="demo", kv_cache_bytes=2**24, kv_cache_dtype=kv_cache_dtype, **settings)
    with Engine(config) as engine:
        tokens = [output.token_ids for output in engine.generate(PROMPTS, GREEDY)]
        assert EngineProbe(engine).kv_storage().dtype == getattr(torch, kv_cache_dtype)
    compared = sum(before_tie for _, before_tie in float32_tokens)
    assert compared >= 0.5 * len(PROMPTS) * GREEDY.max_tokens
    for ours, (reference, before_tie) in zip(tokens, float32_tokens, strict=True):
        assert ours[:min(8, before_tie)] == reference[:min(8, before_tie)]
    same = sum(a == b for ours, (reference, before_tie) in zip(tokens, float32_tokens, strict=True)
               for a, b in zip(ours[:before_tie], reference[:before_tie], strict=True))
    assert same >= 0.9 * compared


def test_a_bfloat16_model_reads_an_int8_pool_through_pytorch():
    """A bfloat16 model on a CPU runs the pure-PyTorch paths: its int8 pool is quantized from bfloat16 K/V and
    dequantized back to bfloat16 as it is gathered. Its perplexity on the prompts stays within 0.5% of the
    bfloat16 pool's (measured +0.17%; greedy tokens flip where bfloat16 logits nearly tie: 3 of 4 prompts agree)."""
    perplexities = {}
    for kv_cache_dtype in ("auto", "int8"):
        with Engine(EngineConfig(model="demo", dtype="bfloat16", kv_cache_bytes=2**24,
                                 kv_cache_dtype=kv_cache_dtype)) as engine:
            assert engine.info.kv_cache_dtype == ("bfloat16" if kv_cache_dtype == "auto" else "int8")
            perplexities[kv_cache_dtype] = engine.perplexity(PROMPTS * 3).perplexity
    assert perplexities["int8"] != perplexities["auto"]
    assert perplexities["int8"] == pytest.approx(perplexities["auto"], rel=0.005)


def test_a_draft_models_pool_stores_the_same_format():
    """The draft's pool shares the KV budget and stores what the target's does."""
    config = EngineConfig(model="demo", speculative="draft", kv_cache_dtype="int8", kv_cache_bytes=2**24)
    estimate = estimate_memory(config)
    with Engine(config) as engine:
        stats = engine.stats()
        outputs = engine.generate(PROMPTS[:2], SamplingParams(max_tokens=16, ignore_eos=True))
    assert stats.kv_cache_bytes == estimate.kv_cache_bytes
    assert all(len(output.token_ids) == 16 for output in outputs)


@pytest.mark.parametrize("settings, message", [
    (dict(kv_cache_dtype="fp8"), r"kv_cache_dtype='fp8' is not one of"),
    (dict(kv_cache_dtype="int8", backend="hf"), r"kv_cache_dtype='int8': the hf backend keeps transformers' own"),
    (dict(kv_cache_dtype="bfloat16", backend="hf"), r"kv_cache_dtype='bfloat16': the hf backend"),
    (dict(kv_cache_dtype="int8", attention="flash-attn"), r"kv_cache_dtype='int8': flash-attn reads"),
])
def test_configurations_that_cannot_use_it_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(**settings)


def test_an_architecture_only_transformers_serves_refuses_it(tmp_path):
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="kv_cache_dtype='int8' is the native engine's KV pool"):
        Engine(EngineConfig(model=str(tmp_path), kv_cache_dtype="int8"))


def test_flash_attn_is_chosen_and_accepted_only_over_a_pool_of_the_models_dtype(monkeypatch):
    """flash-attn's kernels read K/V of the model's own half type: `auto` falls back to sdpa over another pool, and
    asking for it is refused (the rule, checked without a GPU)."""
    monkeypatch.setattr(planning, "flash_attn_available", lambda: True)
    auto = EngineConfig(kv_cache_dtype="float32", block_size=256)
    assert planning._native_attention(auto, "cuda", torch.bfloat16, torch.float32, False) == "sdpa"
    assert planning._native_attention(auto, "cuda", torch.bfloat16, torch.bfloat16, False) == "flash-attn"
    monkeypatch.setattr("engine.config.unavailable_reason", lambda *args: None)
    asked = EngineConfig(kv_cache_dtype="float32", attention="flash-attn", block_size=256)
    with pytest.raises(ConfigError, match="kv_cache_dtype='float32': flash-attn reads a KV cache of the model's"):
        planning._native_attention(asked, "cuda", torch.bfloat16, torch.float32, False)
