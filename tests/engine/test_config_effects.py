"""Every `EngineConfig` field changes what the engine observably does, not only what it echoes back.

Greedy-token equality (tests/e2e/test_equivalence.py) cannot see scheduling or memory: a scheduler that
ignored `max_num_seqs` or ran static batching as continuous would still produce the same tokens. These
tests read the engine's own step records (`step_history()`), `stats()`, `info` and request metrics and
compare them with values worked out by hand from the setting and the model's shape, so a setting that
is silently ignored fails here. Values not built yet are refused with a clear `ConfigError`.

Public API only, on the small random checkpoints of tests/support/tiny_models.py.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from engine import ConfigError, Engine, EngineConfig, RequestError, SamplingParams
from tests.support.engine_waits import wait_for_steps, wait_until_idle
from tests.support.prompts import distinct_prompts
from tests.support.reference_figures import checkpoint_bytes, kv_bytes_per_token

FLOAT32_BYTES = 4
SHORT = SamplingParams(max_tokens=4, ignore_eos=True)


def run_and_record(engine: Engine, prompts, params: SamplingParams = SHORT):
    """Outputs of `prompts` and the steps the engine ran for them (the warm-up's steps excluded)."""
    started = time.perf_counter()
    outputs = engine.generate(prompts, params)
    return outputs, engine.step_history(since=started)


# ---- model, backend, device, dtype, attention ----------------------------------------------------


def test_model_selects_the_checkpoint(tiny_model_dirs):
    prompt = distinct_prompts(1, 6)[0]
    seen = {}
    for name in ("llama-gqa", "qwen3-qk-norm"):
        with Engine(EngineConfig(model=tiny_model_dirs[name])) as engine:
            seen[name] = (engine.info.architecture, engine.info.path,
                          engine.generate(prompt, SamplingParams(max_tokens=8, ignore_eos=True))[0].token_ids)
    assert seen["llama-gqa"][:2] == ("LlamaForCausalLM", tiny_model_dirs["llama-gqa"])
    assert seen["qwen3-qk-norm"][:2] == ("Qwen3ForCausalLM", tiny_model_dirs["qwen3-qk-norm"])
    assert seen["llama-gqa"][2] != seen["qwen3-qk-norm"][2], "two different random models answer differently"


def test_backend_decides_who_serves(tiny_llama_dir):
    """Same greedy tokens either way; only the native backend has a prefix cache, and each says who it is."""
    prefix = distinct_prompts(1, 64)[0]
    seen = {}
    for backend in ("native", "hf"):
        with Engine(EngineConfig(model=tiny_llama_dir, backend=backend, batching="static", dtype="float32")) as engine:
            first = engine.generate(prefix + [5], SHORT)[0]
            second = engine.generate(prefix + [6], SHORT)[0]
            seen[backend] = (engine.info.backend, engine.info.attention, first.token_ids,
                             second.metrics.cached_tokens)
    assert seen["native"][:2] == ("native", "cpu-kernel")  # auto on a CPU in float32: the engine's kernel
    assert seen["hf"][0] == "hf" and seen["hf"][1].startswith("transformers")
    assert seen["native"][2] == seen["hf"][2]
    assert seen["native"][3] == 64 and seen["hf"][3] == 0


def test_device_is_where_the_engine_runs(tiny_llama_dir):
    with Engine(EngineConfig(model=tiny_llama_dir, device="cpu")) as engine:
        assert engine.info.device == "cpu"
    with Engine(EngineConfig(model=tiny_llama_dir, device="auto")) as engine:
        assert engine.info.device == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="device='cuda'.*no CUDA device"):
            Engine(EngineConfig(model=tiny_llama_dir, device="cuda"))


@pytest.mark.parametrize("dtype, element_size", [("float32", 4), ("bfloat16", 2), ("float16", 2)])
def test_dtype_sets_weight_and_kv_bytes(tiny_llama_dir, dtype, element_size):
    kv_budget = 2**20
    with Engine(EngineConfig(model=tiny_llama_dir, device="cpu", dtype=dtype, kv_cache_bytes=kv_budget,
                             block_size=16)) as engine:
        stats = engine.stats()
        assert engine.info.dtype == dtype
        assert engine.generate([5, 6, 7], SHORT)[0].finish_reason == "length"
    assert stats.weights_bytes == checkpoint_bytes(tiny_llama_dir) * element_size // FLOAT32_BYTES
    assert stats.kv_blocks_total == kv_budget // (16 * kv_bytes_per_token(tiny_llama_dir, element_size))


def test_attention_backend_is_the_one_asked_for(tiny_llama_dir):
    prompts = distinct_prompts(3, 20)
    tokens = {}
    for attention in ("sdpa", "eager", "cpu-kernel", "auto"):
        with Engine(EngineConfig(model=tiny_llama_dir, device="cpu", attention=attention)) as engine:
            tokens[engine.info.attention] = [o.token_ids for o in engine.generate(prompts, SHORT)]
    assert set(tokens) == {"sdpa", "eager", "cpu-kernel"}, "auto resolves to the engine's kernel on a CPU"
    assert tokens["sdpa"] == tokens["eager"] == tokens["cpu-kernel"]


def test_cuda_graphs_only_apply_on_cuda(tiny_llama_dir):
    with Engine(EngineConfig(model=tiny_llama_dir, device="cpu", cuda_graphs=True)) as engine:
        assert engine.info.cuda_graphs is False
    # On a GPU, tests/engine/runner/test_cuda_paths.py checks that the setting turns graph capture on and off.


# ---- the KV cache: block_size, kv_cache_bytes, kv_layout, prefix_caching ---------------------------


@pytest.mark.parametrize("block_size, kv_budget", [(4, 2**20), (16, 2**20), (16, 3 * 2**18), (64, 2**20)])
def test_block_size_and_kv_cache_bytes_carve_the_pool(tiny_llama_dir, block_size, kv_budget):
    block_bytes = block_size * kv_bytes_per_token(tiny_llama_dir, FLOAT32_BYTES)
    prompt = distinct_prompts(1, 10)[0]
    with Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", block_size=block_size,
                             kv_cache_bytes=kv_budget)) as engine:
        stats = wait_until_idle(engine)
        _, steps = run_and_record(engine, [prompt])
    assert stats.kv_block_size == block_size
    assert stats.kv_blocks_total == kv_budget // block_bytes
    assert stats.kv_cache_bytes == stats.kv_blocks_total * block_bytes
    assert stats.kv_blocks_free == stats.kv_blocks_total and stats.kv_cache_used_bytes == 0
    assert steps[0].kv_blocks_used == math.ceil(len(prompt) / block_size), "the prompt's blocks after its prefill"
    assert steps[1].kv_blocks_used == math.ceil((len(prompt) + 1) / block_size)


@pytest.mark.parametrize("blocks, expected_peak", [(4, 4), (12, 6)])
def test_kv_cache_bytes_bounds_concurrency(tiny_llama_dir, blocks, expected_peak):
    """Six requests of one 16-token block each: a pool of four blocks runs only four of them at once."""
    block_bytes = 16 * kv_bytes_per_token(tiny_llama_dir, FLOAT32_BYTES)
    with Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", block_size=16, max_model_len=64,
                             kv_cache_bytes=blocks * block_bytes, prefix_caching=False)) as engine:
        outputs, steps = run_and_record(engine, distinct_prompts(6, 8), SamplingParams(max_tokens=8, ignore_eos=True))
        stats = engine.stats()
    assert all(len(o.token_ids) == 8 for o in outputs)
    assert max(step.kv_blocks_used for step in steps) <= blocks
    assert max(step.num_running for step in steps) == expected_peak
    assert stats.peak_running == expected_peak


def test_contiguous_layout_reserves_max_model_len_per_sequence(tiny_llama_dir):
    """The same bytes hold three max-length slabs, or twelve 16-token blocks: 3 vs 6 requests at once."""
    max_model_len = 64
    budget = 3 * max_model_len * kv_bytes_per_token(tiny_llama_dir, FLOAT32_BYTES)
    prompts = distinct_prompts(6, 8)
    seen = {}
    for layout in ("contiguous", "paged"):
        with Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", kv_layout=layout, block_size=16,
                                 max_model_len=max_model_len, kv_cache_bytes=budget, prefix_caching=False,
                                 max_num_seqs=8)) as engine:
            outputs, steps = run_and_record(engine, prompts)
            seen[layout] = (engine.stats(), [o.token_ids for o in outputs], max(s.num_running for s in steps))
    contiguous, paged = seen["contiguous"], seen["paged"]
    assert contiguous[0].kv_block_size == max_model_len and contiguous[0].kv_blocks_total == 3
    assert paged[0].kv_block_size == 16 and paged[0].kv_blocks_total == 12
    assert contiguous[2] == 3 and paged[2] == 6
    assert contiguous[1] == paged[1], "the layout changes memory use, not tokens"


# ---- scheduling: batching, max_num_seqs, max_num_batched_tokens, max_model_len --------------------


LONG_PROMPT = distinct_prompts(1, 8)[0]
LATE_PROMPT = distinct_prompts(1, 5, first=1)[0]


def run_with_a_late_arrival(folder: str, batching: str):
    """A long request starts; a short one arrives while it runs; the long one is cancelled after 8 more steps.

    Returns the steps since the arrival, the short request's output and the time just after it was submitted.
    """
    with Engine(EngineConfig(model=folder, batching=batching, max_num_seqs=4)) as engine:
        long = engine.submit(LONG_PROMPT, SamplingParams(max_tokens=500, ignore_eos=True))
        next(iter(long))  # the long request has its first token: its batch is running
        arrived = time.perf_counter()
        late = engine.submit(LATE_PROMPT, SamplingParams(max_tokens=3, ignore_eos=True))
        submitted = time.perf_counter()
        wait_for_steps(engine, arrived, 8)
        long.cancel()
        long.result()
        output = late.result()
        return engine.step_history(since=arrived), output, submitted


def test_static_batching_starts_a_late_request_only_after_the_batch_ends(tiny_llama_dir):
    steps, late, submitted = run_with_a_late_arrival(tiny_llama_dir, "static")
    assert late.finish_reason == "length" and len(late.token_ids) == 3
    assert all(step.batch_size == 1 for step in steps), "nothing joins a running static batch"
    # the long request decodes alone (1 token a step); then the late one prefills and decodes twice
    assert [step.num_tokens for step in steps] == [1] * (len(steps) - 3) + [len(LATE_PROMPT), 1, 1]
    batch_end = steps[-4].time
    assert late.metrics.ttft > batch_end - submitted, "its first token comes after the batch's last token"


def test_continuous_batching_lets_a_late_request_join(tiny_llama_dir):
    steps, late, _ = run_with_a_late_arrival(tiny_llama_dir, "continuous")
    assert late.finish_reason == "length" and len(late.token_ids) == 3
    shared = [index for index, step in enumerate(steps) if step.batch_size == 2]
    assert len(shared) == 3, "the late request ran all three of its steps beside the long one"
    assert steps[shared[0]].num_tokens == len(LATE_PROMPT) + 1, "its prefill rode along a decode step"
    assert steps[-1].batch_size == 1, "the long request kept going after the late one finished"


@pytest.mark.parametrize("batching", ["continuous", "static"])
@pytest.mark.parametrize("max_num_seqs", [2, 5])
def test_max_num_seqs_caps_every_step(tiny_llama_dir, batching, max_num_seqs):
    with Engine(EngineConfig(model=tiny_llama_dir, batching=batching, max_num_seqs=max_num_seqs)) as engine:
        outputs, steps = run_and_record(engine, distinct_prompts(6, 8))
        stats = engine.stats()
    assert all(len(o.token_ids) == SHORT.max_tokens for o in outputs)
    assert max(step.batch_size for step in steps) == max_num_seqs
    assert max(step.num_running for step in steps) == max_num_seqs
    assert stats.peak_running == max_num_seqs


def test_max_num_batched_tokens_caps_every_step_and_chunks_long_prompts(tiny_llama_dir):
    budget = 16
    long_prompt = distinct_prompts(1, 50)[0]
    with Engine(EngineConfig(model=tiny_llama_dir, max_num_batched_tokens=budget, block_size=4,
                             prefix_caching=False)) as engine:
        (output,), steps = run_and_record(engine, [long_prompt], SamplingParams(max_tokens=3, ignore_eos=True))
        _, busy_steps = run_and_record(engine, distinct_prompts(4, 30, first=1))
    assert len(output.token_ids) == 3
    first_token = next(index for index, step in enumerate(steps) if step.num_decode_tokens)
    prefill = steps[:first_token + 1]
    assert len(prefill) == math.ceil(len(long_prompt) / budget), "the 50-token prompt is prefilled in 4 chunks"
    assert sum(step.num_tokens for step in prefill) == len(long_prompt)
    assert max(step.num_tokens for step in steps + busy_steps) <= budget
    assert sum(step.num_tokens for step in busy_steps) == 4 * 30 + 4 * (SHORT.max_tokens - 1)


def test_max_model_len_bounds_prompt_plus_output(tiny_llama_dir):
    max_model_len, max_num_seqs, block_size = 32, 3, 16
    with Engine(EngineConfig(model=tiny_llama_dir, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                             block_size=block_size)) as engine:
        capped = engine.generate(distinct_prompts(1, 20)[0], SamplingParams(max_tokens=100, ignore_eos=True))[0]
        with pytest.raises(RequestError, match="max_model_len"):
            engine.generate(distinct_prompts(1, max_model_len)[0])
        last_slot = engine.generate(distinct_prompts(1, max_model_len - 1)[0], SHORT)[0]
        info, stats = engine.info, engine.stats()
    assert info.max_model_len == max_model_len
    assert (len(capped.token_ids), capped.finish_reason) == (max_model_len - 20, "length")
    assert len(last_slot.token_ids) == 1
    # left unset, kv_cache_bytes sizes the pool for max_num_seqs sequences of max_model_len tokens
    assert stats.kv_blocks_total == max_num_seqs * math.ceil(max_model_len / block_size)


# ---- seed and the values not built yet -----------------------------------------------------------


def sample_with(folder: str, engine_seed: int, request_seed: int | None = None) -> list[list[int]]:
    with Engine(EngineConfig(model=folder, seed=engine_seed)) as engine:
        params = SamplingParams(max_tokens=12, temperature=1.0, seed=request_seed, ignore_eos=True)
        return [o.token_ids for o in engine.generate(distinct_prompts(2, 6), params)]


def test_engine_seed_makes_unseeded_sampling_reproducible(tiny_llama_dir):
    assert sample_with(tiny_llama_dir, 7) == sample_with(tiny_llama_dir, 7)
    assert sample_with(tiny_llama_dir, 7) != sample_with(tiny_llama_dir, 8)
    assert sample_with(tiny_llama_dir, 7, request_seed=5) == sample_with(tiny_llama_dir, 8, request_seed=5), \
        "a request's own seed wins over the engine's"


def test_num_speculative_tokens_is_validated(tiny_llama_dir):
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        Engine(EngineConfig(model=tiny_llama_dir, num_speculative_tokens=0))

