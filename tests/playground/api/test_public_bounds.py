"""A public server's bounds on the new OpenAI fields, checked before a call is admitted (fast: no server): logprob
alternatives capped lower, structured-output specs (a tool schema's included) bounded in size. `n` x `max_tokens`
against the budget is checked over HTTP in test_openai_api.py."""

from __future__ import annotations

import pytest

from engine.sampling_params import MAX_SPEC_CHARS
from playground.api.errors import APIError
from playground.api.logprobs import parse_logprobs
from playground.api.structured import parse_constraint
from playground.api.tools import parse_tools
from playground.shared.settings import Settings

PUBLIC = Settings.from_env([], {"PLAYGROUND_PUBLIC": "1"})


def refused(call) -> APIError:
    with pytest.raises(APIError) as error:
        call()
    return error.value


def test_top_logprobs_are_capped_lower_in_public():
    assert PUBLIC.max_top_logprobs == 5 and Settings.from_env([], {}).max_top_logprobs == 20
    assert parse_logprobs({"logprobs": True, "top_logprobs": 5}, "chat", PUBLIC.max_top_logprobs) == 5
    assert refused(lambda: parse_logprobs({"logprobs": True, "top_logprobs": 6}, "chat", PUBLIC.max_top_logprobs)
                   ).param == "top_logprobs"
    assert refused(lambda: parse_logprobs({"logprobs": 6}, "text", PUBLIC.max_top_logprobs)).param == "logprobs"


def test_specs_and_tool_schemas_over_the_compile_bound_are_refused_before_admission():
    big = {"type": "string", "enum": ["x" * MAX_SPEC_CHARS]}
    assert refused(lambda: parse_constraint({"response_format": {"type": "json_schema", "json_schema": {
        "name": "r", "schema": big}}})).param == "response_format"
    parameters = {"type": "object", "properties": {"v": {"enum": ["y" * 2000]}}}
    tools = parse_tools({"tools": [{"type": "function", "function": {"name": f"f{i}", "parameters": parameters}}
                                   for i in range(20)], "tool_choice": "required"})
    assert refused(tools.constraint).param == "tools"
