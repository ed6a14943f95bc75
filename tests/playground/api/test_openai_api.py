"""The OpenAI-compatible endpoint, driven by the official `openai` client against the running playground."""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import re
import socket
import time
import urllib.error
import urllib.request
from dataclasses import replace
from types import SimpleNamespace

import jsonschema
import openai
import pytest

from engine import SamplingParams
from playground.api.fields import CHAT, POLICY, REFUSED, TEXT
from playground.shared.settings import Settings
from tests.support.ui_helpers import pick_model, start_app

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "What does the json module do?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = pick_model(tmp_path_factory)
    app, demo, url = start_app(model, Settings(max_new_tokens=200, max_prompt_tokens=400, max_queue=4,
                                               max_concurrent_chats=2, max_message_chars=2000,
                                               max_conversation_chars=5000, max_tokens_in_flight=4000,
                                               max_client_tokens_in_flight=3200, max_body_bytes=2**20,
                                               header_timeout_s=1.0, body_timeout_s=1.0))
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
    for model in ("no-such-model", "/no/such/folder"):
        with pytest.raises(openai.NotFoundError) as missing:
            served.client.models.retrieve(model)
        assert (missing.value.body["code"], missing.value.body["param"]) == ("model_not_found", "model")


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


def test_n_choices_are_distinct_reproducible_and_share_the_prompts_kv_blocks(served):
    """n=3 at temperature 0.8 with a seed: three different replies, the same three on every run, streamed or not;
    choices 1 and 2 find the prompt's full blocks in the prefix cache, computed once by choice 0. The same holds up
    to the logits' rounding, which the prefix cache's state moves: seed 7 drew within that rounding of a token
    boundary on the 2026-12-07 pair (choice 0: "open" on one run, "defined" on the next), so the seed is 11."""
    engine = default_engine(served)
    question = [{"role": "system", "content": "You answer questions about the Python standard library, briefly."},
                {"role": "user", "content": "Tell me something."}]
    ask = {"model": served.model, "messages": question, "n": 3, "temperature": 0.8, "seed": 11, "max_tokens": 16}
    first = served.client.chat.completions.create(**ask)
    texts = [choice.message.content for choice in first.choices]
    assert [choice.index for choice in first.choices] == [0, 1, 2] and len(set(texts)) == 3, texts
    prompt = len(engine.encode(question))
    shared = (prompt - 1) // engine.config.block_size * engine.config.block_size
    assert shared >= engine.config.block_size, "the prompt should fill at least one KV block"
    assert [m["cached_tokens"] for m in first.model_extra["metrics"]] == [0, shared, shared]
    assert first.usage.prompt_tokens == prompt and first.usage.completion_tokens == sum(
        m["output_tokens"] for m in first.model_extra["metrics"])
    assert [c.message.content for c in served.client.chat.completions.create(**ask).choices] == texts
    streamed = {0: "", 1: "", 2: ""}
    for chunk in served.client.chat.completions.create(**ask, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert list(streamed.values()) == texts
    by_prompt = served.client.completions.create(model=served.model, prompt=["import os", "def add(a, b):"], n=2,
                                                 max_tokens=4, temperature=0)
    assert [c.index for c in by_prompt.choices] == [0, 1, 2, 3]
    assert by_prompt.choices[0].text == by_prompt.choices[1].text != by_prompt.choices[2].text
    with pytest.raises(openai.BadRequestError, match="prompts x n x max_tokens"):  # 3 x 8 x 200 over 3200
        served.client.completions.create(model=served.model, prompt=["a", "b", "c"], n=8, max_tokens=200)
    with pytest.raises(openai.BadRequestError, match="n must be") as too_many:
        served.client.chat.completions.create(model=served.model, messages=question, n=9)
    assert too_many.value.body["param"] == "n"


def test_logprobs_are_the_engines_in_both_formats_streamed_or_not(served):
    """At temperature 0.7 with a seed, the chat and completions logprobs equal the engine's own TokenLogprobs (raw
    logits, before temperature) for the same request: the chosen tokens, their bytes, and the top alternatives."""
    engine = default_engine(served)
    sampling = {"max_tokens": 8, "temperature": 0.7, "seed": 3, "extra_body": {"ignore_eos": True}}
    engine_sampling = SamplingParams(max_tokens=8, temperature=0.7, seed=3, ignore_eos=True)
    expected = engine.generate([engine.encode(QUESTION)], replace(engine_sampling, logprobs=3))[0]
    assert expected.logprobs and len(expected.logprobs) == 8
    to_bytes = b"".join(engine.tokenizer.decode([t]).encode() for t in expected.token_ids)
    chat = served.client.chat.completions.create(model=served.model, messages=QUESTION, logprobs=True,
                                                 top_logprobs=3, **sampling)
    content = chat.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([e.logprob for e in expected.logprobs], abs=1e-4)
    assert b"".join(bytes(c.bytes) for c in content) == to_bytes == chat.choices[0].message.content.encode()
    assert [t.logprob for c in content for t in c.top_logprobs] == pytest.approx(
        [lp for e in expected.logprobs for _, lp in e.top], abs=1e-4)
    assert all(len(c.top_logprobs) == 3 for c in content)
    streamed = [c for chunk in served.client.chat.completions.create(
        model=served.model, messages=QUESTION, logprobs=True, top_logprobs=3, stream=True, **sampling)
        for choice in chunk.choices if choice.logprobs for c in choice.logprobs.content]
    assert [c.logprob for c in streamed] == [c.logprob for c in content]
    prompt = "def add(a, b):"
    expected = engine.generate([engine.encode(prompt)], replace(engine_sampling, logprobs=2))[0]
    text = served.client.completions.create(model=served.model, prompt=prompt, logprobs=2, **sampling).choices[0]
    assert text.logprobs.token_logprobs == pytest.approx([e.logprob for e in expected.logprobs], abs=1e-4)
    assert "".join(text.logprobs.tokens) == text.text and len(text.logprobs.top_logprobs[0]) in (2, 3)
    assert text.logprobs.text_offset == [len("".join(text.logprobs.tokens[:i])) for i in range(8)]
    streamed = [c.choices[0].logprobs for c in served.client.completions.create(
        model=served.model, prompt=prompt, logprobs=2, stream=True, **sampling) if c.choices[0].logprobs]
    assert sum((chunk.text_offset for chunk in streamed), []) == text.logprobs.text_offset
    plain = served.client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=2)
    assert plain.choices[0].logprobs is None
    for extra, field in (({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                         ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": 2}, "logprobs")):
        with pytest.raises(openai.BadRequestError) as refused:
            served.client.chat.completions.create(model=served.model, messages=QUESTION, **extra)
        assert refused.value.body["param"] == field


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "required": ["city", "days"],
                                                           "properties": {"city": {"type": "string", "maxLength": 12},
                                                                          "days": {"type": "integer", "minimum": 1,
                                                                                   "maximum": 7}},
                                                           "additionalProperties": False}}}
SCHEMAS = [
    {"type": "object", "required": ["name", "age"], "additionalProperties": False,
     "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0,
                                                                        "maximum": 150}}},
    {"type": "array", "items": {"enum": ["json", "os", "sys"]}, "minItems": 1, "maxItems": 3},
    {"type": "object", "required": ["ok", "tags"], "additionalProperties": False,
     "properties": {"ok": {"type": "boolean"},
                    "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 5}}}},
]
# One value per field of the policy, asking for something (not the neutral value); a field added to the policy
# without a sample here fails the test below.
SAMPLES = {
    "model": {}, "messages": {}, "prompt": {}, "max_tokens": {"max_tokens": 3}, "max_completion_tokens":
    {"max_completion_tokens": 2}, "temperature": {"temperature": 0.5, "seed": 1}, "top_p": {"top_p": 0.5},
    "seed": {"seed": 5, "temperature": 1.0}, "stop": {"stop": ["e"]}, "stream": {"stream": True},
    "stream_options": {"stream": True, "stream_options": {"include_usage": True}}, "n": {"n": 2},
    "logprobs": {"logprobs": True}, "top_logprobs": {"logprobs": True, "top_logprobs": 2},
    "response_format": {"response_format": {"type": "json_object"}, "max_tokens": 40},
    "tools": {"tools": [WEATHER]}, "tool_choice": {"tools": [WEATHER], "tool_choice": "required", "max_tokens": 60},
    "parallel_tool_calls": {"tools": [WEATHER], "parallel_tool_calls": False}, "top_k": {"top_k": 3},
    "ignore_eos": {"ignore_eos": True}, "guided_json": {"guided_json": SCHEMAS[1], "max_tokens": 40},
    "guided_regex": {"guided_regex": "[0-9]{3}"}, "guided_choice": {"guided_choice": ["yes", "no"]},
    "guided_grammar": {"guided_grammar": 'start: "ab" | "cd"'},
    "structured_outputs": {"structured_outputs": {"regex": "[a-c]{2}"}},
    "frequency_penalty": {"frequency_penalty": 0.5}, "presence_penalty": {"presence_penalty": 0.5},
    "logit_bias": {"logit_bias": {"5": 10}}, "best_of": {"best_of": 2}, "echo": {"echo": True},
    "suffix": {"suffix": "end"}, "audio": {"audio": {"voice": "alloy", "format": "wav"}},
    "modalities": {"modalities": ["text", "audio"]}, "functions": {"functions": [WEATHER["function"]]},
    "function_call": {"function_call": "auto"}, "reasoning_effort": {"reasoning_effort": "low"},
    "verbosity": {"verbosity": "low"}, "web_search_options": {"web_search_options": {}},
    "moderation": {"moderation": {"model": "omni-moderation-latest"}}, "service_tier": {"service_tier": "priority"},
    "prediction": {"prediction": {"type": "content", "content": "x"}}, "min_tokens": {"min_tokens": 2},
    "min_p": {"min_p": 0.1}, "repetition_penalty": {"repetition_penalty": 1.2}, "user": {"user": "someone"},
    "safety_identifier": {"safety_identifier": "someone"}, "metadata": {"metadata": {"team": "a"}},
    "store": {"store": True}, "prompt_cache_key": {"prompt_cache_key": "k"},
    "prompt_cache_retention": {"prompt_cache_retention": "24h"},
    "prompt_cache_options": {"prompt_cache_options": {"ttl": "30m"}},
}
TEXT_SAMPLES = {"logprobs": {"logprobs": 2}}  # where the completions route takes another value
# What each honoured field visibly does to the reply (the reply as the client returns it, whole or as chunks).
HONOURED_EFFECTS = {
    "max_tokens": lambda r: r.usage.completion_tokens <= 3,
    "max_completion_tokens": lambda r: r.usage.completion_tokens <= 2,
    "stop": lambda r: "e" not in text_of(r),
    "stream": lambda r: isinstance(r, list) and len(r) > 1,
    "stream_options": lambda r: r[-1].usage is not None and r[-1].usage.completion_tokens > 0,
    "n": lambda r: [c.index for c in r.choices] == [0, 1],
    "logprobs": lambda r: r.choices[0].logprobs is not None,
    "top_logprobs": lambda r: len(r.choices[0].logprobs.content[0].top_logprobs) == 2,
    "response_format": lambda r: isinstance(json.loads(r.choices[0].message.content), dict),
    "tool_choice": lambda r: r.choices[0].finish_reason == "tool_calls",
    "ignore_eos": lambda r: r.usage.completion_tokens == 4,
    "guided_json": lambda r: isinstance(json.loads(text_of(r)), list),
    "guided_regex": lambda r: re.fullmatch("[0-9]{3}", text_of(r)) is not None,
    "guided_choice": lambda r: text_of(r) in ("yes", "no"),
    "guided_grammar": lambda r: text_of(r) in ("ab", "cd"),
    "structured_outputs": lambda r: re.fullmatch("[a-c]{2}", text_of(r)) is not None,
}


def text_of(reply) -> str:
    if isinstance(reply, list):
        return "".join((c.delta.content or "") if hasattr(c, "delta") else c.text for r in reply for c in r.choices)
    choice = reply.choices[0]
    return choice.message.content if hasattr(choice, "message") else choice.text


@pytest.mark.parametrize("route", [CHAT, TEXT])
def test_every_field_is_honoured_refused_by_name_or_documented_as_ignored(served, route):
    """Every field of the policy, sent through the `openai` client asking for something: an honoured field is
    served (and does what it says where that shows in one reply), a refused one is a 400 naming it, an ignored one
    is served; a field the policy does not know is refused."""
    fields = [f for f in POLICY if route in f.routes]
    assert {f.name for f in fields} <= set(SAMPLES), "a field of the policy has no sample value in this test"
    create = served.client.chat.completions.create if route == CHAT else served.client.completions.create
    base = {"model": served.model, "max_tokens": 4, "temperature": 0}
    base.update({"messages": QUESTION} if route == CHAT else {"prompt": "def add(a, b):"})
    failures = []
    for field in fields:
        sample = {**SAMPLES[field.name], **(TEXT_SAMPLES.get(field.name, {}) if route == TEXT else {})}
        stream = sample.pop("stream", False)
        try:
            reply = create(**{**base, "stream": stream, "extra_body": sample}) if stream else create(
                **base, extra_body=sample)
            reply = list(reply) if stream else reply
        except openai.BadRequestError as error:
            if field.policy != REFUSED or error.body.get("param") != field.name:
                failures.append(f"{field.name} ({field.policy}): 400 {error.body}")
            continue
        effect = HONOURED_EFFECTS.get(field.name, lambda _: True)
        if field.policy == REFUSED or not effect(reply):
            failures.append(f"{field.name} ({field.policy}): served as {text_of(reply)!r}")
    assert not failures, "\n".join(failures)
    with pytest.raises(openai.BadRequestError) as unknown:
        create(**base, extra_body={"foo_bar": 1})
    assert unknown.value.body["param"] == "foo_bar"


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_replies_validate_and_a_cut_one_is_partial(served, stream):
    """Each schema's reply finishes "stop" and validates, with speculative decoding off and on (n-gram proposals are
    checked against the grammar); a reply cut by max_tokens is the partial text with "length"; a keyword the grammar
    library cannot enforce is refused naming response_format."""
    for schema, model in itertools.product(SCHEMAS, (served.model, f"{served.model}@speculative-ngram")):
        format_ = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}
        reply = served.client.chat.completions.create(model=model, messages=QUESTION, max_tokens=80,
                                                      response_format=format_, stream=stream)
        reply = list(reply) if stream else reply
        finish = [c.choices[0].finish_reason for c in reply if c.choices][-1] if stream else reply.choices[
            0].finish_reason
        assert finish == "stop", (schema, text_of(reply))
        jsonschema.validate(json.loads(text_of(reply)), schema)
    cut = served.client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=3,
                                                response_format={"type": "json_schema", "json_schema": {
                                                    "name": "r", "schema": SCHEMAS[0]}})
    assert cut.choices[0].finish_reason == "length" and cut.choices[0].message.content.startswith("{")
    with pytest.raises(openai.BadRequestError, match="uniqueItems") as refused:
        served.client.chat.completions.create(model=served.model, messages=QUESTION, response_format={
            "type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "array", "uniqueItems": True}}})
    assert refused.value.body["param"] == "response_format"


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_tool_call_has_arguments_that_validate(served, stream):
    parameters = WEATHER["function"]["parameters"]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        reply = served.client.chat.completions.create(
            model=served.model, messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
            tools=[WEATHER], tool_choice=choice, max_tokens=80, stream=stream)
        if stream:
            chunks = [c.choices[0] for c in reply if c.choices]
            calls = [call for c in chunks for call in c.delta.tool_calls or []]
            assert not "".join(c.delta.content or "" for c in chunks), "a call was streamed as content"
            finish = chunks[-1].finish_reason
        else:
            calls, finish = reply.choices[0].message.tool_calls, reply.choices[0].finish_reason
            assert reply.choices[0].message.content is None
        assert finish == "tool_calls" and len(calls) == 1 and calls[0].function.name == "get_weather"
        jsonschema.validate(json.loads(calls[0].function.arguments), parameters)
    auto = served.client.chat.completions.create(model=served.model, messages=QUESTION, tools=[WEATHER],
                                                 max_tokens=12, temperature=0).choices[0]
    assert auto.message.content and not auto.message.tool_calls, "the demo model answers in text under auto"


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
        client.chat.completions.create(model=served.model, messages=QUESTION, presence_penalty=0.5)
    with pytest.raises(openai.BadRequestError, match="characters"):
        client.chat.completions.create(model=served.model, messages=[{"role": "user", "content": "x" * 2001}])
    with pytest.raises(openai.BadRequestError, match="role"):
        client.chat.completions.create(model=served.model, messages=[{"role": "wizard", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="no preset"):
        client.completions.create(model=f"{served.model}@../../etc/passwd", prompt="hi")
    with pytest.raises(openai.NotFoundError, match="unknown model|not a curated name"):
        client.completions.create(model="no-such-model", prompt="hi")
    nan_temperature = json.dumps({"model": served.model, "messages": QUESTION, "temperature": 0.5})
    nan_temperature = nan_temperature.replace("0.5", "NaN")
    for body, message in ((b"{not json", "JSON"), (nan_temperature.encode(), "temperature")):
        request = urllib.request.Request(served.url + "v1/chat/completions", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request, timeout=10)
        assert error.value.code == 400 and message in json.loads(error.value.read())["error"]["message"]


@pytest.mark.parametrize(("method", "path", "status", "words"), [
    ("POST", "v1/embeddings", 404, "no /v1/embeddings"), ("GET", "v1/no/such/route", 404, "no /v1/no/such/route"),
    ("GET", "v1/chat/completions", 405, "takes POST, not GET")])
def test_routes_it_does_not_serve_answer_in_openais_format(served, method, path, status, words):
    """An unknown route (or a known one asked with the wrong method) gets OpenAI's error shape, not FastAPI's
    {"detail": "Not Found"}, so a client reads it like any other refusal."""
    request = urllib.request.Request(served.url + path, method=method, data=b"{}" if method == "POST" else None,
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=10)
    body = json.loads(error.value.read())
    assert error.value.code == status and words in body["error"]["message"], body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.NotFoundError):
        served.client.embeddings.create(model=served.model, input="hi")


def test_the_allow_list_and_the_queue_bound_hold(served):
    from playground.api.errors import APIError
    from playground.api.openai import OpenAIService

    service = OpenAIService(served.app)
    limit = served.app.settings.max_concurrent_chats + served.app.settings.max_queue
    for index in range(limit):
        service.admission.admit(f"client-{index}", 1)
    with pytest.raises(APIError, match="busy") as busy:
        service.admission.admit("another", 1)
    assert busy.value.status == 429
    from playground.app import create_playground

    restricted = create_playground(Settings(allowed_models=frozenset({served.model})), default_model=served.model)
    with pytest.raises(APIError, match="not allowed") as refused:
        OpenAIService(restricted).config_for("someone/huge-model")
    assert refused.value.status == 404 and refused.value.code == "model_not_found"
    assert restricted.pool.entries() == []


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


# ----- what one client may cost -----------------------------------------------------------------------------


def raw_post(served, path: str, payload: dict, source: str = "127.0.0.1", timeout: float = 60):
    """(connection, response) of a POST sent from the loopback address `source` (each one is its own client)."""
    host, port = served.url.split("//")[1].rstrip("/").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout, source_address=(source, 0))
    connection.request("POST", path, body=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    return connection, connection.getresponse()


def test_a_non_streaming_client_that_disconnects_cancels_every_prompt(served):
    """16 prompts of up to 200 tokens each, and the client gives up after 0.3 s: the engine stops them all."""
    engine = default_engine(served)
    started = time.perf_counter()
    body = {"model": served.model, "prompt": ["Tell me a long story."] * 16, "max_tokens": 200, "ignore_eos": True}
    with pytest.raises(TimeoutError):
        raw_post(served, "/v1/completions", body, timeout=0.3)
    deadline = time.monotonic() + 30
    while (engine.stats().num_running or engine.stats().num_waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats().num_running == engine.stats().num_waiting == 0
    generated = sum(step.num_output_tokens for step in engine.step_history(since=started))
    assert generated < 16 * 200 / 4, f"{generated} tokens generated for a client that had gone"
    # The server still answers. One retry: the client's pooled keep-alive connection may have been closed by the
    # server while this test waited (the fixture's 1 s header timeout), which the client sees as a reset.
    assert served.client.with_options(max_retries=1).models.list().data


def test_the_tokens_in_flight_are_bounded_per_client(served):
    """One client's requests may hold max_client_tokens_in_flight tokens (prompts x max_tokens, 3,200 here): with 16
    prompts of 200 tokens streaming, its next request waits its turn (429) while another client is served, and its
    tokens come back when its stream ends."""
    ask = {"model": served.model, "prompt": ["def add(a, b):"] * 16, "max_tokens": 200, "ignore_eos": True,
           "stream": True}
    small = {"model": served.model, "prompt": "def add(a, b):", "max_tokens": 2}
    first, streaming = raw_post(served, "/v1/completions", ask, source="127.0.0.2")
    try:
        assert streaming.readline().startswith(b"data: ")
        second, refused = raw_post(served, "/v1/completions", small, source="127.0.0.2")
        assert refused.status == 429 and "PLAYGROUND_MAX_CLIENT_TOKENS_IN_FLIGHT" in refused.read().decode()
        second.close()
        other, answered = raw_post(served, "/v1/completions", small, source="127.0.0.3")
        assert answered.status == 200 and json.loads(answered.read())["usage"]["completion_tokens"] == 2
        other.close()
    finally:
        first.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        again, reply = raw_post(served, "/v1/completions", small, source="127.0.0.2")
        status = reply.status
        again.close()
        if status == 200:
            break
        time.sleep(0.1)
    assert status == 200, "the client's tokens were not given back when its stream ended"


def test_requests_are_served_as_asked_or_refused(served):
    """max_completion_tokens: null leaves max_tokens in force; fields this server does not implement are refused by
    name, and so is a prompt that leaves no room for its max_tokens (as vLLM refuses it)."""
    client = served.client
    reply = client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=3,
                                           extra_body={"max_completion_tokens": None, "ignore_eos": True})
    assert reply.usage.completion_tokens == 3
    for field, value in (("repetition_penalty", 1.2), ("min_tokens", 5), ("min_p", 0.1), ("logit_bias", {"1": 2}),
                         ("user", 5)):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=2,
                                           extra_body={field: value})
        assert refused.value.body["param"] == field
    from playground.api.errors import APIError
    from playground.api.openai import OpenAIService

    service = OpenAIService(served.app)
    with pytest.raises(APIError, match="maximum context length is 1024") as too_long:
        service._sampling({"max_tokens": 100}, [[5] * 1000], 1024, "chat")
    assert (too_long.value.param, too_long.value.code) == ("messages", "context_length_exceeded")
    assert service._sampling({}, [[5] * 1000], 1024, "text").max_tokens == 24  # no max_tokens: what fits


def test_a_conversation_over_the_cap_is_refused_before_it_is_tokenised(served, monkeypatch):
    engine = default_engine(served)
    encoded = []
    monkeypatch.setattr(engine, "encode", lambda prompt, encode=engine.encode: encoded.append(1) or encode(prompt))
    messages = [{"role": "user", "content": "os path " * 160}] * 4  # 1,280 characters each, 5,120 in all
    with pytest.raises(openai.BadRequestError, match="PLAYGROUND_MAX_CONVERSATION_CHARS") as refused:
        served.client.chat.completions.create(model=served.model, messages=messages, max_tokens=2)
    assert refused.value.body["param"] == "messages" and not encoded
    served.client.chat.completions.create(model=served.model, messages=QUESTION, max_tokens=2)
    assert encoded


def test_request_bodies_and_their_headers_are_bounded(served):
    """Over max_body_bytes (1 MiB here): 413 as soon as the declared length says so, or as soon as a chunked body
    grows past it, without reading the rest; a body or headers that do not arrive in time end the connection."""
    host, port = served.url.split("//")[1].rstrip("/").split(":")
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + b"Content-Length: 52428800\r\n\r\n" + b" " * 65536)  # 50 MB declared, 64 KB sent
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        # a client that sends its whole body before it reads: the rest is drained, so it is not reset mid-send
        sock.sendall(head + b"Content-Length: 52428800\r\n\r\n" + b" " * 52428800)
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
        with contextlib.suppress(OSError):  # the server closes the connection once it has answered
            for _ in range(4):
                sock.sendall(b"80000\r\n" + b" " * 0x80000 + b"\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + b"Content-Length: 100\r\n\r\n{")  # 99 bytes never come
        assert sock.recv(4096).startswith(b"HTTP/1.1 408")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # the headers never end
        started = time.monotonic()
        assert sock.recv(4096) == b"" and time.monotonic() - started < 5
    assert served.client.models.list().data
