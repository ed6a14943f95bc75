"""Function tools without a server: what the model is shown, the schema that forces a call, how a reply becomes a
`tool_calls` entry, and how a stream holds back text that may yet be a call (fast)."""

from __future__ import annotations

import json

import pytest

from playground.api.errors import APIError
from playground.api.tools import CallStream, parse_tools, with_tool_turns_as_text, with_tools_shown

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


def test_a_reply_is_a_call_only_when_it_is_exactly_one():
    tools = parse_tools({"tools": [WEATHER]})
    call = tools.call_of('{"name": "get_weather", "arguments": {"city": "Oslo"}}')
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"} and call["function"]["name"] == "get_weather"
    for text in ("It is sunny.", '{"name": "other", "arguments": {}}', '{"name": "get_weather"}', "{"):
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
