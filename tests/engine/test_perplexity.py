"""`Engine.perplexity`: the quality figure beside every speed and memory figure.

It runs through the engine's own forward pass, so it must equal transformers' perplexity for the
unquantized model and rise when quantization or GQA pooling damages the model; it is scored on
the engine loop between serving steps, so requests keep flowing while it runs.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch
import torch.nn.functional as F

from engine import Engine, EngineConfig, EngineError, RequestError, SamplingParams
from engine.core.perplexity import held_out_texts

WINDOW = 256


def transformers_perplexity(path: str, texts: list[str]) -> float:
    """The reference: transformers' logits over the same stream (BOS before each text), windows of 257."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    stream = []
    for text in texts:
        stream += [tokenizer.bos_token_id, *tokenizer.encode(text, add_special_tokens=False)]
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(stream) - 1, WINDOW):
            window = torch.tensor([stream[start:start + WINDOW + 1]])
            logits = model(input_ids=window[:, :-1]).logits[0]
            total += F.cross_entropy(logits.double(), window[0, 1:], reduction="sum").item()
            count += window.shape[1] - 1
    return math.exp(total / count)


@pytest.fixture(scope="module")
def demo_engine():
    with Engine(EngineConfig(model="demo", dtype="float32", kv_cache_bytes=2**24)) as engine:
        yield engine


@pytest.fixture(scope="module")
def demo_perplexity(demo_engine):
    return demo_engine.perplexity()


def test_demo_perplexity_equals_transformers(demo_engine, demo_perplexity):
    texts = held_out_texts()
    reference = transformers_perplexity(demo_engine.info.path, texts)
    assert demo_perplexity.perplexity == pytest.approx(reference, rel=1e-4)
    assert demo_perplexity.tokens > 10_000 and demo_perplexity.source == "demo held-out text"
    assert demo_engine.stats().kv_blocks_free == demo_engine.stats().kv_blocks_total  # scratch blocks freed


def test_default_figure_is_cached(demo_engine, demo_perplexity):
    assert demo_engine.perplexity() is demo_perplexity


@pytest.mark.parametrize("damage", [dict(quantization="nf4"), dict(gqa=4)])
def test_quantized_or_pooled_model_has_higher_perplexity(demo_perplexity, damage):
    with Engine(EngineConfig(model="demo", dtype="float32", kv_cache_bytes=2**24, **damage)) as engine:
        damaged = engine.perplexity()
    assert damaged.tokens == demo_perplexity.tokens
    assert damaged.perplexity > demo_perplexity.perplexity


def test_int8_changes_perplexity_by_rounding_noise_only(demo_perplexity):
    """8-bit weights move the figure by rounding noise, either way (on the bundled target: -0.004%)."""
    with Engine(EngineConfig(model="demo", dtype="float32", kv_cache_bytes=2**24, quantization="int8")) as engine:
        damaged = engine.perplexity()
    assert damaged.tokens == demo_perplexity.tokens
    assert damaged.perplexity != demo_perplexity.perplexity
    assert damaged.perplexity == pytest.approx(demo_perplexity.perplexity, rel=0.01)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "bfloat16"])
def test_a_quantized_kv_cache_costs_less_than_half_a_percent(demo_perplexity, kv_cache_dtype):
    """Every window's attention reads K/V as the pool stores them (a prompt's own keys too), so the figure sees the
    KV cache's precision: measured on the bundled target, int8 105.544 and bfloat16 105.553 against float32's
    105.552 (-0.007%, +0.001%). A cache read without its int8 scales, or not read at all, fails this."""
    with Engine(EngineConfig(model="demo", dtype="float32", kv_cache_bytes=2**24,
                             kv_cache_dtype=kv_cache_dtype)) as engine:
        measured = engine.perplexity()
    assert measured.tokens == demo_perplexity.tokens
    assert measured.perplexity != demo_perplexity.perplexity
    assert measured.perplexity == pytest.approx(demo_perplexity.perplexity, rel=0.005)


def test_mha_expansion_keeps_perplexity(demo_perplexity, tiny_chat_dir):
    texts = ["The engine batches requests together.", "Paged attention stores keys and values in blocks."]
    figures = {}
    for gqa in ("native", "mha"):
        with Engine(EngineConfig(model=tiny_chat_dir, dtype="float32", gqa=gqa)) as engine:
            figures[gqa] = engine.perplexity(texts).perplexity
    assert figures["mha"] == pytest.approx(figures["native"], rel=1e-5)


def test_perplexity_runs_while_requests_are_served(demo_engine):
    texts = held_out_texts()[:6]
    alone = demo_engine.perplexity(texts)
    progress: list[tuple[int, int]] = []
    outputs = []
    chat = threading.Thread(target=lambda: outputs.extend(demo_engine.generate(
        [[{"role": "user", "content": "What does the json module do?"}]] * 4,
        SamplingParams(max_tokens=48, ignore_eos=True))))
    chat.start()
    busy = demo_engine.perplexity(texts, progress=lambda done, total: progress.append((done, total)))
    chat.join()
    assert [o.finish_reason for o in outputs] == ["length"] * 4
    assert busy.perplexity == pytest.approx(alone.perplexity, rel=1e-5)
    assert progress[0] == (0, busy.windows) and progress[-1] == (busy.windows, busy.windows)
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)


def test_hf_backend_measures_the_same_model(tiny_chat_dir):
    texts = ["def add(a, b):\n    return a + b", "The engine batches requests together."]
    figures = {}
    for backend in ("native", "hf"):
        with Engine(EngineConfig(model=tiny_chat_dir, backend=backend, dtype="float32")) as engine:
            figures[backend] = engine.perplexity(texts).perplexity
    assert figures["hf"] == pytest.approx(figures["native"], rel=1e-4)


def test_bad_texts_get_one_clear_error_and_the_engine_keeps_serving(demo_engine):
    for bad in ([], "just a string", [1, 2], ["ok", "\ud800"]):
        with pytest.raises(RequestError):
            demo_engine.perplexity(bad)
    assert demo_engine.generate("import os", SamplingParams(max_tokens=2))[0].finish_reason in ("length", "stop")


def test_closing_fails_a_pending_measurement(tiny_chat_dir):
    engine = Engine(EngineConfig(model=tiny_chat_dir, dtype="float32"))
    started = threading.Event()
    errors = []

    def measure():
        started.set()
        try:
            engine.perplexity(["word " * 200_000])  # hundreds of windows: still running at close
        except EngineError as error:
            errors.append(str(error))

    worker = threading.Thread(target=measure)
    worker.start()
    started.wait()
    engine.close()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert len(errors) == 1 and "closed" in errors[0]
