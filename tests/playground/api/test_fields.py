"""The OpenAI field policy: it covers every field the `openai` client can send, the docs show it as the code
enforces it, and each policy is enforced as written (fast: no server)."""

from __future__ import annotations

import pytest
from openai.types import completion_create_params as text_params
from openai.types.chat import completion_create_params as chat_params

from playground.api import fields
from playground.api.errors import APIError
from playground.api.fields import CHAT, POLICY, TEXT, check_fields


def names(route: str, vllm: bool | None = None) -> set[str]:
    return {f.name for f in POLICY if route in f.routes and (vllm is None or f.vllm == vllm)}


@pytest.mark.parametrize(("route", "params"), [(CHAT, chat_params.CompletionCreateParamsStreaming),
                                               (TEXT, text_params.CompletionCreateParamsStreaming)])
def test_the_policy_names_every_field_of_openais_reference_and_only_those(route, params):
    """The installed `openai` client's request types are OpenAI's reference: each of their fields has a row, and
    every row that is not a vLLM extension is one of them."""
    assert names(route, vllm=False) == params.__required_keys__ | params.__optional_keys__


def test_the_docs_table_is_the_generated_one():
    text = fields.DOCS.read_text(encoding="utf-8")
    assert fields.docs_with_table(text) == text, "docs/api.md is stale: python -m playground.api.fields --write"
    assert "| `n` |" in text and "| `user` |" in text


def refusal(body: dict, route: str = CHAT) -> APIError:
    with pytest.raises(APIError) as error:
        check_fields(body, route)
    assert error.value.status == 400
    return error.value


def test_unknown_fields_and_fields_of_the_other_route_are_refused_by_name():
    assert refusal({"foo_bar": 1}).param == "foo_bar"
    assert refusal({"echo": False}, CHAT).param == "echo"  # a completions field
    assert refusal({"messages": []}, TEXT).param == "messages"


@pytest.mark.parametrize("field", [f for f in POLICY if f.policy == fields.REFUSED], ids=lambda f: f.name)
def test_a_refused_field_is_refused_unless_neutral(field):
    route = field.routes[0]
    error = refusal({field.name: {"asked": True}}, route)
    assert error.param == field.name and "not supported" in str(error)
    for value in field.neutral:
        check_fields({field.name: value}, route)


@pytest.mark.parametrize("field", [f for f in POLICY if f.policy == fields.IGNORED], ids=lambda f: f.name)
def test_an_ignored_field_is_taken_when_it_has_its_type(field):
    route = field.routes[0]
    good = {str: "someone", dict: {"k": "v"}, bool: True}[field.shape[1]]
    check_fields({field.name: good}, route)
    check_fields({field.name: None}, route)
    wrong = 5 if field.shape[1] is not bool else "yes"
    assert refusal({field.name: wrong}, route).param == field.name
