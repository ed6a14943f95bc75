"""Structured output in the playground: the setting read into the engine's GuidedDecoding (a bad schema or regex is
one clear refusal), and the verdict under a reply (parses and validates, or why not)."""

from __future__ import annotations

import json
import time

import pytest

from engine import GuidedDecoding
from playground.figures.validity import REGEX_CHECK_S, Validity, reply_validity, validity_html
from playground.shared.errors import Refused
from playground.shared.structured_output import parse_structured_output

SCHEMA = json.dumps({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                      "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
                     "required": ["name"]})


def test_the_setting_becomes_the_engines_guided_decoding():
    assert parse_structured_output("off", "ignored", 1000) is None
    assert parse_structured_output("JSON object", "", 1000) == GuidedDecoding("json_object")
    assert parse_structured_output("JSON schema", f"  {SCHEMA}\n", 1000) == GuidedDecoding("json_schema", SCHEMA)
    assert parse_structured_output("regex", "(yes|no) ", 1000) == GuidedDecoding("regex", "(yes|no) ")


@pytest.mark.parametrize(("choice", "spec", "message"), [
    ("JSON schema", '{"type": "object",', r"not valid JSON: .* \(line 1, column 19\)"),
    ("JSON schema", "[1, 2]", "must be a JSON object"),
    ("JSON schema", '{"type": "objekt"}', "not a valid JSON Schema at type"),
    ("JSON schema", "   ", "write the JSON schema"),
    ("regex", "(yes|no", "the regex does not compile: missing \\)"),
    ("regex", "x" * 101, "at most 100"),
    ("regex", "a\ud800", "lone surrogate"),
    ("xml", "", "must be one of off, JSON object, JSON schema, regex"),
    (["regex"], "", "must be one of off, JSON object, JSON schema, regex"),  # not text: refused, not a TypeError
])
def test_a_bad_schema_or_regex_is_one_clear_refusal_naming_the_setting(choice, spec, message):
    with pytest.raises(Refused, match=message) as refusal:
        parse_structured_output(choice, spec, 100)
    assert refusal.value.field == "structured output"


@pytest.mark.parametrize(("kind", "spec", "reply", "finish", "valid", "line"), [
    ("json_schema", SCHEMA, '{"name": "ada", "tags": ["a"]}', "stop", True, "✓ valid against the schema"),
    ("json_schema", SCHEMA, '{"name": "ada", "tags": ["c"]}', "stop", False, "✗ fails the schema at tags/0: 'c' is not "
                                                                              "one of ['a', 'b']"),
    ("json_schema", SCHEMA, '{"tags": []}', "stop", False, "✗ fails the schema at the top level: 'name' is a required "
                                                           "property"),
    ("json_schema", SCHEMA, '{"name": "ada", "ta', "length", False, "✗ cut by max tokens (finish: length)"),
    ("json_schema", SCHEMA, '{"name": "ada"', "cancelled", False, "✗ stopped before it ended (finish: cancelled)"),
    ("json_object", "", '{"a": 1}', "stop", True, "✓ a JSON object"),
    ("json_object", "", "[1]", "stop", False, "✗ JSON, but a list, not an object"),
    ("json_object", "", "{'a': 1}", "stop", False, "✗ not JSON: Expecting property name enclosed in double quotes at "
                                                   "character 1"),
    ("regex", r"(yes|no)\.", "yes.", "stop", True, "✓ matches the regex"),
    ("regex", r"(yes|no)\.", "yes. And", "stop", False, "✗ does not match the regex"),  # the whole reply must match
])
def test_the_verdict_under_a_reply(kind, spec, reply, finish, valid, line):
    assert reply_validity(kind, spec, reply, finish) == Validity(valid, line)


def test_a_regex_that_backtracks_catastrophically_is_not_checked_past_its_time_bound():
    started = time.perf_counter()
    assert reply_validity("regex", r"(a|aa)+b", "a" * 60 + "c", "stop") == Validity(
        False, f"? not checked: matching the regex took over {REGEX_CHECK_S:g} s")
    assert time.perf_counter() - started < REGEX_CHECK_S + 2


def test_the_verdict_line_is_escaped_and_coloured():
    shown = validity_html(Validity(False, "✗ fails the schema at x: '<b>' is not of type 'integer'"))
    assert shown == ('<div class="reply-validity bad">✗ fails the schema at x: \'&lt;b&gt;\' is not of type '
                     "'integer'</div>")
    assert 'class="reply-validity ok"' in validity_html(Validity(True, "✓ valid against the schema"))
