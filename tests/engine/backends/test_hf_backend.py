"""The hf backend (plain transformers under the engine's API): same tokens as `generate`, real streaming."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import Engine, EngineConfig, SamplingParams
from tests.support.reference_figures import checkpoint_bytes, kv_bytes_per_token, memory_in_use
from tests.support.tiny_models import build_tiny_model, build_tiny_tokenizer

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [3] * 20, [100, 200, 300, 17]]
MODES = ["static", "continuous"]


@pytest.fixture(scope="module")
def hf_model_dir(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("hf-backend") / "llama"
    build_tiny_model("llama-gqa", folder)
    build_tiny_tokenizer(folder)
    return str(folder)


@pytest.fixture(scope="module")
def reference(hf_model_dir):
    model = AutoModelForCausalLM.from_pretrained(hf_model_dir, dtype=torch.float32).eval()

    def greedy(prompt: list[int], max_new_tokens: int) -> list[int]:
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
        return out[0, len(prompt):].tolist()
    return greedy


@pytest.fixture(scope="module", params=MODES)
def engine(request, hf_model_dir):
    with Engine(EngineConfig(model=hf_model_dir, backend="hf", dtype="float32", batching=request.param,
                             max_num_seqs=8)) as eng:
        yield eng


def test_greedy_equals_generate(engine, reference):
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    outputs = engine.generate(PROMPTS, params)
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        assert output.finish_reason == "length"
        assert output.token_ids == reference(prompt, 12)


def test_sequential_generate_equals_generate(hf_model_dir, reference):
    with Engine(EngineConfig(model=hf_model_dir, backend="hf", dtype="float32", batching="static",
                             max_num_seqs=1)) as eng:
        outputs = eng.generate(PROMPTS[:2], SamplingParams(max_tokens=6, ignore_eos=True))
        assert eng.stats().peak_running == 1
    assert [o.token_ids for o in outputs] == [reference(p, 6) for p in PROMPTS[:2]]


def test_stream_text_equals_generate_text(engine):
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    prompt = "The engine batches"
    streamed = list(engine.stream(prompt, params))
    final = engine.generate(prompt, params)[0]
    assert "".join(d.text for d in streamed) == final.text
    assert [t for d in streamed for t in d.token_ids] == final.token_ids
    assert len(streamed) >= 2  # tokens arrive as they are produced, not in one piece


def test_metrics_and_stats(engine, hf_model_dir):
    before = time.perf_counter()
    output = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    after = time.perf_counter()
    metrics = output.metrics
    assert metrics.output_tokens == 8 and metrics.prompt_tokens == len(PROMPTS[0])
    assert 0 < metrics.ttft <= metrics.e2el <= after - before
    assert len(metrics.itl) == 7 and all(gap > 0 for gap in metrics.itl), "each token is stamped when produced"
    assert metrics.cached_tokens == 0, "transformers keeps no cache across requests"
    history = engine.step_history(since=before)
    assert sum(step.num_decode_tokens for step in history) == 8, "each generated token is counted in one step"
    if engine.config.batching == "static":  # generate's callback stamps the tokens and records the step alike
        times = [step.time for step in history]
        assert metrics.itl == pytest.approx([b - a for a, b in zip(times, times[1:], strict=False)], abs=1e-4)
    in_use = memory_in_use(engine.info.device)
    stats = engine.stats()
    weights = checkpoint_bytes(hf_model_dir)
    assert weights <= stats.weights_bytes <= weights * 1.001, "the checkpoint's tensors (plus RoPE buffers)"
    assert stats.peak_memory_bytes >= 0.9 * in_use, "the peak, in bytes"
    if engine.config.batching == "static":
        assert stats.kv_cache_bytes == 0 and any("not tracked" in note for note in stats.notes), \
            "an untracked 0 says so"


def test_cancel_stops_the_request(engine):
    handle = engine.submit([7, 8, 9], SamplingParams(max_tokens=400, ignore_eos=True))
    deltas = iter(handle)
    for _ in range(3):
        next(deltas)
    handle.cancel()
    output = handle.result()
    assert output.finish_reason == "cancelled"
    assert 3 <= len(output.token_ids) < 400
    after = engine.generate([PROMPTS[1]], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert after.finish_reason == "length"  # the engine keeps serving


def test_seeded_sampling_is_reproducible(engine):
    params = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, top_k=20, seed=123, ignore_eos=True)
    first = engine.generate([PROMPTS[0]], params)[0].token_ids
    second = engine.generate([PROMPTS[0]], params)[0].token_ids
    assert first == second and len(first) == 8


def test_continuous_reports_its_paged_cache(hf_model_dir):
    budget, page = 1 << 20, 16
    with Engine(EngineConfig(model=hf_model_dir, backend="hf", batching="continuous", dtype="float32",
                             block_size=page, kv_cache_bytes=budget)) as eng:
        stats = eng.stats()
    assert stats.kv_block_size == page
    assert stats.kv_blocks_total == budget // (page * kv_bytes_per_token(hf_model_dir, 4))
    assert budget <= stats.kv_cache_bytes <= 1.05 * budget
