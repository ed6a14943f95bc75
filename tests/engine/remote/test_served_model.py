"""`backend='remote'`: a model another server serves, behind the same calls as a local `Engine`.

The server is this app's own `/v1`, started as `python app.py` in a second process (a real server over real HTTP),
serving the bundled demo model; the local reference is the same model in an in-process `Engine`. Both are given the
same token ids (the served model encodes with the configuration's `model` tokenizer), so greedy text is the same.
"""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, ModelLoadError, RequestError, SamplingParams, open_engine
from engine.remote.served import ServedModel
from tests.support.llama_cpp_marks import needs_llama_cpp
from tests.support.llama_cpp_server import llama_cpp_server
from tests.support.misbehaving_server import KEY, MODEL, MisbehavingServer
from tests.support.ui_helpers import app_process

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "1, 2, 3,"]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def app_url():
    with app_process() as url:
        yield url


@pytest.fixture(scope="module")
def served(app_url):
    with open_engine(EngineConfig(backend="remote", remote_url=f"{app_url}/v1", remote_model="demo")) as engine:
        yield engine


def test_open_engine_gives_a_served_model_that_says_where_its_figures_come_from(served, app_url):
    assert isinstance(served, ServedModel)
    assert served.info.backend == "remote" and served.info.device == f"{app_url}/v1"
    assert any("measured at this client" in notice for notice in served.info.notices)
    assert served.step_history() == [] and served.decode_profile() is None


def test_greedy_text_equals_the_local_engines_on_the_same_token_ids(served):
    with Engine(EngineConfig(model="demo")) as local:
        expected = local.generate(PROMPTS, GREEDY)
    got = served.generate(PROMPTS, GREEDY)
    assert [o.text for o in got] == [o.text for o in expected]
    for remote, own in zip(got, expected, strict=True):
        assert remote.finish_reason == "length" and remote.error is None
        # token counts are the server's usage, and they agree with the local engine's
        assert (remote.metrics.prompt_tokens, remote.metrics.output_tokens) == (len(own.prompt_token_ids),
                                                                                len(own.token_ids))
        assert remote.metrics.ttft is not None and 0 < remote.metrics.ttft <= remote.metrics.e2el


def test_a_stream_closed_early_cancels_and_the_model_keeps_serving(served):
    stream = served.stream("Tell me a long story.", SamplingParams(max_tokens=200, ignore_eos=True))
    first = next(stream)
    assert not first.finished
    stream.close()
    again = served.generate(["Hi"], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert again.finish_reason == "length"


def test_what_a_server_cannot_give_is_refused_clearly(served):
    with pytest.raises(RequestError, match="runs on the server"):
        served.submit("Hi", SamplingParams(max_tokens=2, logprobs=1))
    with pytest.raises(RequestError, match="runs on the server"):
        served.perplexity()


def test_an_unknown_model_or_an_unreachable_server_fails_the_load_with_one_clear_error(app_url):
    with pytest.raises(ModelLoadError, match="no-such-model"):
        open_engine(EngineConfig(backend="remote", remote_url=f"{app_url}/v1", remote_model="no-such-model"))
    with pytest.raises(ModelLoadError, match="127.0.0.1:9"):
        open_engine(EngineConfig(backend="remote", remote_url="http://127.0.0.1:9/v1", remote_model="demo"))


@needs_llama_cpp
def test_llama_cpps_own_server_serves_the_same_greedy_text_from_the_prompts_text():
    """llama.cpp's Python server takes no token ids and streams no usage: the served model sends the ids' text and
    counts tokens with its own tokenizer, and says both; its f32 GGUF's greedy text is the native engine's, or where
    it parts from it, the native token there is one the server penalises: it penalises repeated tokens by default
    (repeat_penalty 1.1, over the prompt and the reply), which the OpenAI API cannot turn off."""
    params = SamplingParams(max_tokens=12, temperature=0.0)
    prompts = PROMPTS[:2]
    with Engine(EngineConfig(model="demo")) as local:
        expected = local.generate(prompts, params)
        decode = local.tokenizer.decode
    with llama_cpp_server() as base, open_engine(EngineConfig(backend="remote", remote_url=base,
                                                              remote_model="demo")) as served:
        assert any("takes no token-id prompts" in notice for notice in served.info.notices)
        handles = [served.submit(prompt, params) for prompt in prompts]  # in flight together: the server queues
        got = [handle.result() for handle in handles]
        assert served.stats().notes and "publishes no Prometheus /metrics" in served.stats().notes[0]
    for remote, own in zip(got, expected, strict=True):
        same = 0
        while same < len(own.token_ids) and remote.text.startswith(decode(own.token_ids[:same + 1])):
            same += 1
        assert same == len(own.token_ids) or own.token_ids[same] in (
            list(own.prompt_token_ids) + list(own.token_ids[:same])), (remote.text, own.text)
        assert "counted by this client's tokenizer" in remote.ignored["stream_options.include_usage"]
        assert (remote.metrics.prompt_tokens, remote.metrics.output_tokens) == (len(own.prompt_token_ids),
                                                                                len(own.token_ids))


def test_the_api_key_variable_reaches_the_server_and_its_metrics_become_the_stats(monkeypatch):
    """Against a server that answers 401 without the key: remote_api_key_env names the variable whose key is sent,
    and the server's /metrics (vLLM's series) are the served model's stats, each with its source."""
    with MisbehavingServer("unauthorized") as server:
        config = EngineConfig(backend="remote", remote_url=server.base_url, remote_model=MODEL,
                              remote_api_key_env="SERVED_MODEL_TEST_KEY")
        monkeypatch.delenv("SERVED_MODEL_TEST_KEY", raising=False)
        with pytest.raises(ModelLoadError, match="SERVED_MODEL_TEST_KEY"):
            open_engine(config)
        monkeypatch.setenv("SERVED_MODEL_TEST_KEY", KEY)
        with open_engine(config) as served:
            assert served.generate(["Hi"], SamplingParams(max_tokens=3))[0].finish_reason == "length"
            stats = served.stats()
        assert (stats.num_running, stats.num_waiting, stats.prefix_cache_hit_rate) == (3, 1, 0.25)
        assert any("vllm:kv_cache_usage_perc" in note for note in stats.notes)
