"""The OpenAI-compatible endpoint, driven by the official `openai` client against the running playground."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import openai
import pytest

from engine import SamplingParams
from playground.shared.settings import Settings
from tests.support.ui_helpers import pick_model, start_app

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "What does the json module do?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = pick_model(tmp_path_factory)
    app, demo, url = start_app(model, Settings(max_new_tokens=200, max_prompt_tokens=400, max_queue=4,
                                               max_concurrent_chats=2, max_message_chars=2000))
    client = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=120)
    yield SimpleNamespace(app=app, url=url, model=model, client=client)
    demo.close()
    app.pool.close()


def default_engine(served):
    with served.app.pool.lease(served.app.default_config) as entry:
        return entry.engine


def test_models_lists_the_servable_models(served):
    ids = [m.id for m in served.client.models.list().data]
    assert ids[0] == served.model and len(ids) == len(set(ids))
    assert served.client.models.retrieve(served.model).id == served.model


def test_chat_completion_matches_the_engine_and_reports_its_usage(served):
    response = served.client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=12,
                                                     temperature=0)
    engine = default_engine(served)
    prompt_ids = engine.encode(QUESTION)
    expected = engine.generate([prompt_ids], SamplingParams(max_tokens=12))[0]
    choice = response.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == expected.text
    assert response.usage.prompt_tokens == len(prompt_ids)
    assert response.usage.completion_tokens == len(expected.token_ids)
    assert response.usage.total_tokens == len(prompt_ids) + len(expected.token_ids)
    assert choice.finish_reason == {"stop": "stop", "length": "length"}[expected.finish_reason]
    assert response.model_extra["metrics"][0]["engine_ttft_ms"] > 0


def test_streaming_chat_sends_the_same_text_as_events_with_usage(served):
    whole = served.client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=12,
                                                  temperature=0)
    chunks = list(served.client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=12,
                                                        temperature=0, stream=True,
                                                        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2, "the reply did not stream"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens,
                                                              whole.usage.completion_tokens)


def test_completions_take_text_and_token_ids_and_a_preset(served):
    engine = default_engine(served)
    ids = engine.encode("def add(a, b):")
    by_text = served.client.completions.create(model=served.model, prompt="def add(a, b):", max_tokens=8,
                                               temperature=0)
    by_ids = served.client.completions.create(model=served.model, prompt=[ids, ids], max_tokens=8, temperature=0)
    assert [c.text for c in by_ids.choices] == [by_text.choices[0].text] * 2
    assert by_ids.usage.prompt_tokens == 2 * len(ids) and by_text.usage.prompt_tokens == len(ids)
    long_prompt = ids * 6  # several full KV blocks
    served.client.completions.create(model=served.model, prompt=long_prompt, max_tokens=2, temperature=0)
    again = served.client.completions.create(model=served.model, prompt=long_prompt, max_tokens=2, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= 16, "the prefix cache's hits are not reported"
    for _ in range(2):
        preset = served.client.completions.create(model=f"{served.model}@no-prefix-cache", prompt=long_prompt,
                                                   max_tokens=2, temperature=0)
        assert preset.usage.prompt_tokens_details.cached_tokens == 0
    assert any(not e.key.prefix_caching for e in served.app.pool.entries())


def test_streamed_completions_of_several_prompts_keep_their_indexes(served):
    events = list(served.client.completions.create(model=served.model, prompt=["def add(a, b):", "import os"],
                                                   max_tokens=6, temperature=0, stream=True))
    texts = {0: "", 1: ""}
    for event in events:
        texts[event.choices[0].index] += event.choices[0].text
    single = served.client.completions.create(model=served.model, prompt="import os", max_tokens=6, temperature=0)
    assert texts[1] == single.choices[0].text and texts[0]


def test_bad_requests_get_openai_style_errors(served):
    client = served.client
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=201)
    with pytest.raises(openai.BadRequestError, match="not supported"):
        client.chat.completions.create(model=served.model, messages=QUESTION, n=2)
    with pytest.raises(openai.BadRequestError, match="characters"):
        client.chat.completions.create(model=served.model, messages=[{"role": "user", "content": "x" * 2001}])
    with pytest.raises(openai.BadRequestError, match="role"):
        client.chat.completions.create(model=served.model, messages=[{"role": "wizard", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="no preset"):
        client.completions.create(model=f"{served.model}@../../etc/passwd", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="unknown model|not a curated name"):
        client.completions.create(model="no-such-model", prompt="hi")
    nan_temperature = json.dumps({"model": served.model, "messages": QUESTION, "temperature": 0.5})
    nan_temperature = nan_temperature.replace("0.5", "NaN")
    for body, message in ((b"{not json", "JSON"), (nan_temperature.encode(), "temperature")):
        request = urllib.request.Request(served.url + "v1/chat/completions", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request, timeout=10)
        assert error.value.code == 400 and message in json.loads(error.value.read())["error"]["message"]


def test_the_allow_list_and_the_queue_bound_hold(served):
    from playground.api.openai import APIError, OpenAIService

    service = OpenAIService(served.app)
    limit = served.app.settings.max_concurrent_chats + served.app.settings.max_queue
    for _ in range(limit):
        service._admit()
    with pytest.raises(APIError, match="busy") as busy:
        service._admit()
    assert busy.value.status == 429
    from playground.app import create_playground

    restricted = create_playground(Settings(allowed_models=frozenset({served.model})), default_model=served.model)
    with pytest.raises(APIError, match="not allowed") as refused:
        OpenAIService(restricted).config_for("someone/huge-model")
    assert refused.value.status == 403 and restricted.pool.entries() == []


def test_a_client_that_disconnects_cancels_its_request(served):
    engine = default_engine(served)
    body = json.dumps({"model": served.model, "prompt": "Tell me a long story.", "max_tokens": 200, "stream": True,
                       "ignore_eos": True}).encode()
    request = urllib.request.Request(served.url + "v1/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.readline().startswith(b"data: ")
    deadline = time.monotonic() + 30
    while engine.stats().num_running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats().num_running == 0
    decoded = sum(step.num_decode_tokens for step in engine.step_history(since=started))
    assert decoded < 199, "the request ran to its end although its client had gone"
    assert served.client.models.list().data  # the server keeps serving


def test_the_bench_can_target_the_endpoint(served, tmp_path):
    from engine.tools.bench import main

    report = tmp_path / "endpoint.json"
    code = main(["--endpoint", served.url + "v1", "--model", served.model, "--num-prompts", "4", "--input-len", "8",
                 "--output-len", "5", "--prefix-len", "32", "--concurrency", "1", "--compare", "no-prefix-cache",
                 "--json", str(report)])
    result = json.loads(report.read_text())
    assert code == 0 and result["completed"] == 4 and result["total_output_tokens"] == 4 * 5
    assert result["total_input_tokens"] == 4 * 40 and result["mean_ttft_ms"] > 0 and result["mean_tpot_ms"] > 0
    assert result["prefix_cache_hit_rate"] > 0.5, "the shared prefix should come from the prefix cache"
    assert result["compare"]["prefix_cache_hit_rate"] == 0 and result["compare"]["config"]["prefix_caching"] is False
