"""The public API: streaming, cancellation, concurrency, stop conditions, sampling and bad input."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from engine import ConfigError, Engine, EngineConfig, ModelLoadError, RequestError, SamplingParams
from tests.support.engine_waits import wait_until_idle
from tests.support.reference_figures import checkpoint_bytes, element_size, kv_bytes_per_token, memory_in_use


@pytest.fixture(scope="module")
def chat_engine(tiny_chat_dir):
    with Engine(EngineConfig(model=tiny_chat_dir, block_size=4, max_num_seqs=8)) as engine:
        yield engine


def test_stream_yields_the_same_text_as_generate(chat_engine):
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    prompt = "The engine batches"
    generated = chat_engine.generate(prompt, params)[0]
    deltas = list(chat_engine.stream(prompt, params))
    assert "".join(d.text for d in deltas) == generated.text
    assert [t for d in deltas for t in d.token_ids] == generated.token_ids
    assert deltas[-1].finished and deltas[-1].finish_reason == "length"
    assert len(generated.token_ids) == 40 and generated.text
    running = deltas[-2].metrics
    assert running.output_tokens == len([t for d in deltas[:-1] for t in d.token_ids]) and running.ttft > 0
    assert running.itl == [] and len(deltas[-1].metrics.itl) == 39


def test_chat_messages_use_the_chat_template(chat_engine):
    messages = [{"role": "user", "content": "hello"}]
    rendered = chat_engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat_engine.encode(messages) == chat_engine.tokenizer.encode(rendered, add_special_tokens=False)
    output = chat_engine.generate(messages, SamplingParams(max_tokens=5, ignore_eos=True))[0]
    assert output.metrics.prompt_tokens == len(chat_engine.encode(messages))


def test_closing_a_stream_cancels_and_frees_its_blocks(chat_engine):
    stream = chat_engine.stream("Paged attention", SamplingParams(max_tokens=400, ignore_eos=True))
    first = next(stream)
    assert not first.finished
    stream.close()
    stats = wait_until_idle(chat_engine)
    assert stats.kv_blocks_free == stats.kv_blocks_total


def test_cancel_from_another_thread_ends_the_request(chat_engine):
    handle = chat_engine.submit("héllo wörld", SamplingParams(max_tokens=400, ignore_eos=True))
    next(iter(handle))
    handle.cancel()
    output = handle.result()
    assert output.finish_reason == "cancelled"
    assert 0 < len(output.token_ids) < 400
    stats = wait_until_idle(chat_engine)
    assert stats.kv_blocks_free == stats.kv_blocks_total


def test_concurrent_callers_get_their_own_correct_results(chat_engine):
    prompts = [f"request number {i} about café" * (1 + i % 3) for i in range(8)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    expected = [chat_engine.generate(p, params)[0].token_ids for p in prompts]
    results: dict[int, list[int]] = {}

    def call(index: int) -> None:
        results[index] = chat_engine.generate(prompts[index], params)[0].token_ids

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [results[i] for i in range(len(prompts))] == expected
    assert chat_engine.stats().peak_running > 1, "concurrent callers were batched together"


def test_stop_string_truncates_text_and_stops(chat_engine):
    free_run = chat_engine.generate("def add", SamplingParams(max_tokens=30, ignore_eos=True))[0]
    stop = free_run.text[5:8]
    assert stop
    stopped = chat_engine.generate("def add", SamplingParams(max_tokens=30, ignore_eos=True, stop=[stop]))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == free_run.text[:free_run.text.index(stop)]
    streamed = "".join(d.text for d in chat_engine.stream("def add", SamplingParams(max_tokens=30, ignore_eos=True,
                                                                                    stop=[stop])))
    assert streamed == stopped.text


def test_eos_stops_unless_ignored(tiny_chat_dir, tmp_path):
    folder = tmp_path / "eos-model"
    shutil.copytree(tiny_chat_dir, folder)
    with Engine(EngineConfig(model=str(folder))) as engine:
        free_run = engine.generate([5, 6, 7], SamplingParams(max_tokens=20, ignore_eos=True))[0].token_ids
    eos = free_run[3]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    with Engine(EngineConfig(model=str(folder))) as engine:
        stopped = engine.generate([5, 6, 7], SamplingParams(max_tokens=20))[0]
        ignored = engine.generate([5, 6, 7], SamplingParams(max_tokens=20, ignore_eos=True))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free_run[:free_run.index(eos) + 1]
    assert ignored.token_ids == free_run and ignored.finish_reason == "length"


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(chat_engine):
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
    alone = chat_engine.generate("The engine", params)[0].token_ids
    batched = chat_engine.generate(["The engine", "other prompt", "third one"], params)[0].token_ids
    other_seed = chat_engine.generate("The engine", SamplingParams(max_tokens=16, temperature=1.0, seed=99,
                                                                   ignore_eos=True))[0].token_ids
    assert alone == batched
    assert alone != other_seed


def test_metrics_are_the_engine_s_own_step_times(chat_engine):
    """A request alone in the engine gets one token per step, stamped with that step's time: its TTFT, ITL and
    TPOT follow from the step records, and its TTFT is bounded by the caller's own clock."""
    wait_until_idle(chat_engine)
    prompt = "Paged attention stores"
    before = time.perf_counter()
    output = chat_engine.generate(prompt, SamplingParams(max_tokens=10, ignore_eos=True))[0]
    steps = chat_engine.step_history(since=before)
    metrics = output.metrics
    times = [step.time for step in steps]
    assert len(steps) == 10, "one step computes the prompt and samples the first token, then one step a token"
    assert (metrics.output_tokens, metrics.prompt_tokens) == (10, len(chat_engine.encode(prompt)))
    assert steps[0].duration <= metrics.ttft <= times[0] - before
    assert metrics.itl == pytest.approx([b - a for a, b in zip(times, times[1:], strict=False)], abs=1e-4)
    assert metrics.e2el - metrics.ttft == pytest.approx(times[-1] - times[0], abs=1e-4)
    assert metrics.tpot == pytest.approx((times[-1] - times[0]) / 9, rel=1e-2)


def test_stats_report_the_pool_the_weights_and_the_running_requests(chat_engine, tiny_chat_dir):
    element = element_size(chat_engine.info.dtype)
    block_bytes = 4 * kv_bytes_per_token(tiny_chat_dir, element)  # chat_engine has block_size=4
    stream = chat_engine.stream("Paged attention", SamplingParams(max_tokens=400, ignore_eos=True))
    next(stream)
    busy = chat_engine.stats()
    stream.close()
    in_use = memory_in_use(chat_engine.info.device)
    idle = wait_until_idle(chat_engine)
    assert busy.num_running == 1 and busy.kv_cache_used_bytes > 0
    assert busy.kv_cache_used_bytes % block_bytes == 0
    assert idle.kv_cache_bytes == idle.kv_blocks_total * block_bytes
    assert (idle.kv_blocks_free, idle.kv_cache_used_bytes) == (idle.kv_blocks_total, 0)
    assert idle.weights_bytes == checkpoint_bytes(tiny_chat_dir) * element // 4  # saved in float32
    assert idle.peak_memory_bytes >= 0.9 * in_use, "the peak, in bytes"
    assert idle.spec_acceptance_rate == 0.0, "speculative decoding is off"
    assert chat_engine.step_history(), "steps are recorded for the live charts"


# ---- bad input: one clear error, and the engine keeps serving ------------------------------------


def test_bad_requests_are_refused_and_the_engine_keeps_serving(chat_engine):
    with pytest.raises(RequestError, match="max_model_len"):
        chat_engine.generate([5] * 10_000)
    with pytest.raises(RequestError, match="temperature"):
        chat_engine.generate("hi", SamplingParams(temperature=-1))
    with pytest.raises(RequestError, match="top_p"):
        chat_engine.generate("hi", SamplingParams(top_p=0))
    with pytest.raises(RequestError, match="max_tokens"):
        chat_engine.generate("hi", SamplingParams(max_tokens=0))
    with pytest.raises(RequestError, match="token ids"):
        chat_engine.generate([10**9])
    with pytest.raises(RequestError, match="empty"):
        chat_engine.generate("")
    with pytest.raises(RequestError, match="max_model_len"):
        chat_engine.generate(["fine", [5] * 10_000])
    assert chat_engine.stats().num_waiting == 0, "a batch with one bad prompt queues nothing"
    assert chat_engine.generate("still serving", SamplingParams(max_tokens=3))[0].token_ids


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="unknown model"):
        Engine(EngineConfig(model="no such model"))
    with pytest.raises(ModelLoadError, match="Hugging Face Hub"):
        Engine(EngineConfig(model="nobody-here/does-not-exist-xyz"))


def test_unsupported_architecture(tmp_path):
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="backend='hf'"):
        Engine(EngineConfig(model=str(tmp_path), backend="native"))


@pytest.mark.parametrize("settings, message", [
    (dict(kv_layout="contiguous", prefix_caching=True), "prefix_caching"),
    (dict(batching="dynamic"), "batching"),
    (dict(block_size=3), "power of two"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(attention="flash-attn", device="cpu"), "CUDA"),
    (dict(speculative="draft", model="org/no-curated-draft"), "draft_model"),
    (dict(kv_cache_bytes=-5), "kv_cache_bytes"),
    (dict(gqa="many"), "gqa"),
    (dict(seed=10**30), "seed must be a 64-bit integer"),  # torch's generator overflowed at load
])
def test_impossible_configs_are_refused_up_front(settings, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(**settings).validate()


def test_config_checks_that_need_the_model(tiny_llama_dir):
    with pytest.raises(ConfigError, match="max_model_len"):
        Engine(EngineConfig(model=tiny_llama_dir, max_model_len=100_000))
    with pytest.raises(ConfigError, match="cannot hold one sequence"):
        Engine(EngineConfig(model=tiny_llama_dir, kv_cache_bytes=1000))
    with pytest.raises(ConfigError, match="unknown config field"):
        EngineConfig.from_dict({"modle": "x"})
