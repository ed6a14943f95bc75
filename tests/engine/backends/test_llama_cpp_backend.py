"""The llama.cpp backend under the engine's API: its f32 GGUF answers as the native float32 engine does (greedy and
seeded), on the demo model and on the tiny Llama shapes (GQA, MQA with tied embeddings, Llama 3 RoPE, Mistral), one
request at a time with the previous prompt's prefix reused, recorded and measured like the other backends."""

from __future__ import annotations

import threading

import pytest

from engine import Engine, EngineConfig, SamplingParams, estimate_memory, resolve_model_path
from engine.gguf.files import gguf_path
from tests.support.llama_cpp_marks import needs_llama_cpp

pytestmark = needs_llama_cpp

CHAT = ["What is collections.Counter?", "How do I use pathlib.Path?", "Explain itertools.chain.",
        "what does os.path.join do"]
GREEDY = SamplingParams(max_tokens=48, ignore_eos=True)
TINY = ["llama-gqa", "llama-mqa-tied", "llama3-rope-scaling", "mistral"]
TINY_PROMPTS = [[5, 6, 7, 8, 9], [3] * 20, [100, 200, 300, 17, 42, 42, 7], list(range(10, 74))]


@pytest.fixture(scope="module")
def native():
    with Engine(EngineConfig(model="demo", device="cpu", dtype="float32")) as engine:
        yield engine


@pytest.fixture(scope="module")
def llama():
    with Engine(EngineConfig(model="demo", backend="llama.cpp")) as engine:
        yield engine


def _chat(engine: Engine, question: str) -> list[int]:
    return engine.encode([{"role": "user", "content": question}])


def test_f32_greedy_equals_the_native_float32_engine(native, llama):
    prompts = [_chat(native, question) for question in CHAT]
    assert [o.token_ids for o in llama.generate(prompts, GREEDY)] == [
        o.token_ids for o in native.generate(prompts, GREEDY)]


def test_seeded_sampling_draws_what_the_native_engine_draws(native, llama):
    params = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=11, ignore_eos=True)
    prompts = [_chat(native, question) for question in CHAT[:2]]
    assert [o.token_ids for o in llama.generate(prompts, params)] == [
        o.token_ids for o in native.generate(prompts, params)]


@pytest.mark.parametrize("name", TINY)
def test_tiny_llama_shapes_answer_as_the_native_engine(name, tiny_model_dirs):
    """GQA and MQA heads (the K rows' interleaving per KV head), a tied output, Llama 3 RoPE factors, Mistral."""
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    outputs = {}
    for backend in ("native", "llama.cpp"):
        with Engine(EngineConfig(model=tiny_model_dirs[name], backend=backend, device="cpu", dtype="float32",
                                 max_model_len=256)) as engine:
            outputs[backend] = [o.token_ids for o in engine.generate(TINY_PROMPTS, params)]
    assert outputs["llama.cpp"] == outputs["native"]


def test_a_prompt_reuses_the_previous_requests_prefix_and_answers_the_same(llama):
    first = _chat(llama, CHAT[0])
    follow = first + llama.generate([first], GREEDY)[0].token_ids + [2, 201] + _chat(llama, CHAT[1])
    reused = llama.generate([follow], GREEDY)[0]
    assert reused.metrics.cached_tokens >= len(first)
    llama.generate([[7, 8, 9]], SamplingParams(max_tokens=2))  # another sequence: nothing of `follow` is left
    fresh = llama.generate([follow], GREEDY)[0]
    assert fresh.metrics.cached_tokens == 0 and fresh.token_ids == reused.token_ids


def test_requests_run_one_at_a_time_first_in_first_out(llama):
    prompts = [_chat(llama, question) for question in CHAT]
    handles = [llama.submit(prompt, SamplingParams(max_tokens=8, ignore_eos=True)) for prompt in prompts]
    metrics = [handle.result().metrics for handle in handles]
    for before, after in zip(metrics, metrics[1:], strict=False):  # submitted within a few ms of each other
        assert after.ttft > before.e2el - 0.05, (before, after)
    steps = llama.step_history()
    assert {step.batch_size for step in steps} == {1} and {step.num_running for step in steps} == {1}


def test_steps_are_recorded_and_stats_count_the_file_and_one_sequence(llama):
    since = llama.step_history()[-1].time if llama.step_history() else 0.0
    prompt = _chat(llama, "What does json.dumps do?")
    output = llama.generate([prompt], SamplingParams(max_tokens=5, ignore_eos=True))[0]
    steps = llama.step_history(since)  # one prefill step (the prompt fits one llama_decode), then 4 decode steps
    assert [s.num_tokens for s in steps] == [len(prompt) - output.metrics.cached_tokens, 1, 1, 1, 1]
    assert [s.num_output_tokens for s in steps] == [1] * 5 and all(s.duration > 0 for s in steps)
    assert [s.context_tokens for s in steps] == [len(prompt) + index for index in range(5)]
    stats = llama.stats()
    assert stats.weights_bytes == gguf_path(resolve_model_path("demo"), "f32").stat().st_size
    assert stats.kv_cache_bytes == llama.info.kv_bytes_per_token * llama.info.max_model_len == llama.plan.kv_cache_bytes
    assert estimate_memory(llama.plan).total_bytes == stats.weights_bytes + stats.kv_cache_bytes
    assert llama.info.backend == "llama.cpp" and llama.info.kv_cache_dtype == "float32"


def test_cancelling_the_running_request_lets_the_next_one_run(llama):
    prompt = _chat(llama, CHAT[2])
    handle = llama.submit(prompt, SamplingParams(max_tokens=400, ignore_eos=True))
    waiting = llama.submit(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    stream = iter(handle)
    next(stream)
    handle.cancel()
    assert handle.result().finish_reason == "cancelled"
    assert waiting.result().finish_reason == "length"


def test_guided_decoding_is_refused_and_logprobs_come_from_llama_cpps_logits(llama, native):
    from engine import GuidedDecoding, RequestError

    with pytest.raises(RequestError, match="served through llama.cpp"):
        llama.submit("x", SamplingParams(guided=GuidedDecoding(kind="regex", spec="[ab]+")))
    params = SamplingParams(max_tokens=3, logprobs=2)
    prompt = _chat(llama, CHAT[0])
    ours, theirs = (engine.generate([prompt], params)[0].logprobs for engine in (llama, native))
    assert [t.token_id for t in ours] == [t.token_id for t in theirs]
    assert all(abs(a.logprob - b.logprob) < 1e-3 for a, b in zip(ours, theirs, strict=True))


def test_perplexity_matches_the_native_engine(llama, native):
    texts = ["The engine batches requests together.", "Paged attention stores keys and values in blocks."]
    assert abs(llama.perplexity(texts).perplexity - native.perplexity(texts).perplexity) < 1e-2


def test_many_threads_are_served(llama):
    prompts = [_chat(llama, question) for question in CHAT]
    results = [None] * len(prompts)

    def ask(index):
        results[index] = llama.generate([prompts[index]], SamplingParams(max_tokens=6, ignore_eos=True))[0]

    threads = [threading.Thread(target=ask, args=(index,)) for index in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(r is not None and r.finish_reason == "length" for r in results)
