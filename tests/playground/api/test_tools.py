"""Function tools without a server: what the model is shown, the schema that forces a call, how a reply becomes a
`tool_calls` entry, and how a stream holds back text that may yet be a call (fast)."""

from __future__ import annotations

import json

import pytest

from playground.api.errors import APIError
from playground.api.tools import CallStream, encode_chat, parse_tools, with_tool_turns_as_text, with_tools_shown

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def test_required_and_named_choices_constrain_the_reply_to_calls_of_the_tools():
    named = parse_tools({"tools": [WEATHER, TIME], "tool_choice": {"type": "function",
                                                                   "function": {"name": "get_weather"}}})
    schema = json.loads(named.constraint().guided.spec)
    assert schema["properties"] == {"name": {"const": "get_weather"},
                                    "arguments": WEATHER["function"]["parameters"]}
    required = json.loads(parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required"}).constraint().guided.spec)
    assert [s["properties"]["name"]["const"] for s in required["anyOf"]] == ["get_weather", "get_time"]
    assert parse_tools({"tools": [WEATHER]}).constraint() is None  # auto
    assert parse_tools({"tools": [WEATHER], "tool_choice": "none"}).constraint() is None


def test_the_tools_are_shown_in_the_system_message_unless_the_choice_is_none():
    tools = parse_tools({"tools": [WEATHER]})
    shown = with_tools_shown([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], tools)
    assert shown[0]["content"].startswith("Be brief.\n\nYou can call") and "get_weather" in shown[0]["content"]
    assert with_tools_shown([{"role": "user", "content": "Hi"}], tools)[0]["role"] == "system"
    hidden = parse_tools({"tools": [WEATHER], "tool_choice": "none"})
    assert with_tools_shown([{"role": "user", "content": "Hi"}], hidden) == [{"role": "user", "content": "Hi"}]


class TemplateEngine:
    """What encode_chat asks of an engine: whether its template renders tools, and the encode it gets."""

    def __init__(self, renders_tools: bool):
        self.renders_tools, self.tokenizer, self.encoded = renders_tools, type("T", (), {"chat_template": "x"}), []

    def encode(self, prompt, tools=None):
        self.encoded.append((prompt, tools))
        return [1]


def test_a_template_that_renders_tools_is_given_them_and_others_see_them_in_the_system_message():
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    native, plain = TemplateEngine(True), TemplateEngine(False)
    for engine in (native, plain):
        encode_chat(engine, messages, parse_tools({"tools": [WEATHER, TIME]}))
        encode_chat(engine, messages, parse_tools({"tools": [WEATHER], "tool_choice": "none"}))
    assert native.encoded[0] == (messages, [WEATHER, {"type": "function", "function": {
        "name": "get_time", "description": "", "parameters": {"type": "object"}}}])
    assert plain.encoded[0][1] is None and "get_weather" in plain.encoded[0][0][0]["content"]
    assert native.encoded[1] == plain.encoded[1] == (messages, None)  # tool_choice none: no tools shown


def test_a_reply_is_a_call_only_when_it_is_exactly_one():
    tools = parse_tools({"tools": [WEATHER]})
    call = tools.call_of('{"name": "get_weather", "arguments": {"city": "Oslo"}}')
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"} and call["function"]["name"] == "get_weather"
    tagged = tools.call_of('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n')
    assert tagged["function"] == call["function"]  # as Hermes-style templates (Qwen2.5, 3) ask for calls
    for text in ("It is sunny.", '{"name": "other", "arguments": {}}', '{"name": "get_weather"}', "{",
                 '<tool_call>{"name": "get_weather", "arguments": {}}', "<tool_call>It is sunny.</tool_call>"):
        assert tools.call_of(text) is None


def test_a_stream_holds_back_what_may_be_a_call_and_releases_text():
    tools = parse_tools({"tools": [WEATHER]})
    text = CallStream(tools)
    assert text.feed(" ") == "" and text.feed("Sunny") == " Sunny" and text.feed(" today") == " today"
    assert text.finish(cut=False) == ("", None)
    call = CallStream(tools)
    assert call.feed('{"name": "get_weather", ') == "" and call.feed('"arguments": {"city": "Oslo"}}') == ""
    rest, entry = call.finish(cut=False)
    assert rest == "" and entry["function"]["name"] == "get_weather"
    tagged = CallStream(tools)
    assert tagged.feed("<tool") == "" and tagged.feed('_call>{"name": "get_weather", "arguments": {}}') == ""
    assert tagged.feed("</tool_call>") == "" and tagged.finish(cut=False)[1]["function"]["name"] == "get_weather"
    angled = CallStream(tools)
    assert angled.feed("<b") == "<b"  # not the start of a call tag: text at once
    cut = CallStream(tools)
    cut.feed('{"name": "get_wea')
    assert cut.finish(cut=True) == ('{"name": "get_wea', None)


def test_earlier_tool_turns_become_text_turns():
    messages = with_tool_turns_as_text([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    assert messages[1] == {"role": "assistant", "content": '{"name": "get_weather", "arguments": {"city": "Oslo"}}'}
    assert messages[2] == {"role": "user", "content": "Result of call_1: sunny"}


@pytest.mark.parametrize(("body", "field"), [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools"),
])
def test_bad_tools_are_refused_naming_the_field(body, field):
    with pytest.raises(APIError) as error:
        parse_tools(body)
    assert (error.value.status, error.value.param) == (400, field)
