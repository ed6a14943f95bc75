"""Structured-output fields map onto the engine's GuidedDecoding, one constraint per call, each refusal naming its
field, and a spec too large to compile is refused before anything compiles it (fast: no server)."""

from __future__ import annotations

import json

import pytest

from engine import GuidedDecoding
from engine.sampling_params import MAX_SPEC_CHARS
from playground.api.errors import APIError
from playground.api.structured import parse_constraint

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.mark.parametrize(("body", "field", "expected"), [
    ({"response_format": {"type": "json_object"}}, "response_format", GuidedDecoding("json_object")),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "strict": True}}},
     "response_format", GuidedDecoding("json_schema", json.dumps(SCHEMA))),
    ({"guided_json": json.dumps(SCHEMA)}, "guided_json", GuidedDecoding("json_schema", json.dumps(SCHEMA))),
    ({"guided_regex": "[a-z]+"}, "guided_regex", GuidedDecoding("regex", "[a-z]+")),
    ({"guided_choice": ["yes", "no."]}, "guided_choice", GuidedDecoding("regex", r"(yes)|(no\.)")),
    ({"guided_grammar": "start: \"a\""}, "guided_grammar", GuidedDecoding("grammar", "start: \"a\"")),
    ({"structured_outputs": {"regex": "[0-9]+"}}, "structured_outputs", GuidedDecoding("regex", "[0-9]+")),
    ({"structured_outputs": {"json": SCHEMA}}, "structured_outputs", GuidedDecoding("json_schema", json.dumps(SCHEMA))),
])
def test_each_field_becomes_one_guided_decoding(body, field, expected):
    constraint = parse_constraint(body)
    assert (constraint.field, constraint.guided) == (field, expected)


def test_text_or_no_field_asks_for_nothing():
    assert parse_constraint({"response_format": {"type": "text"}}) is None and parse_constraint({}) is None


@pytest.mark.parametrize(("body", "field"), [
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "x": 1}}},
     "response_format"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_regex": 5}, "guided_regex"),
    ({"structured_outputs": {"regex": "a", "json": SCHEMA}}, "structured_outputs"),
    ({"structured_outputs": {"choice": [""]}}, "structured_outputs"),
    ({"guided_json": {"type": "string", "enum": ["x" * MAX_SPEC_CHARS]}}, "guided_json"),
])
def test_a_bad_or_second_constraint_is_refused_naming_its_field(body, field):
    with pytest.raises(APIError) as error:
        parse_constraint(body)
    assert (error.value.status, error.value.param) == (400, field)
