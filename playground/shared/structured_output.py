"""The structured-output setting (the chat's and Compare's) -> the engine's `GuidedDecoding`, checked up front.

Why one parser: a JSON schema or a regex comes from anyone, and a mistake in it should be one line under the
chat box before any engine is leased, not a failed reply. What Python can check is checked here (the schema is
JSON, an object, and a valid JSON Schema; the regex compiles); what only the grammar library knows (a keyword it
cannot enforce, its own regex dialect) the engine refuses when the request is submitted (`Engine.check_guided`),
and the chat reports that refusal the same way.
"""

from __future__ import annotations

import json

import jsonschema
import regex

from engine import MAX_SPEC_CHARS, GuidedDecoding
from playground.shared.errors import Refused

OFF = "off"
# the choice as the page shows it -> GuidedDecoding.kind
KINDS = {"JSON object": "json_object", "JSON schema": "json_schema", "regex": "regex"}
CHOICES = (OFF, *KINDS)
FIELD = "structured output"


def parse_structured_output(choice, spec, max_chars: int) -> GuidedDecoding | None:
    """None for "off", else the GuidedDecoding the choice and its text ask for; Refused naming the problem."""
    if choice in (None, "", OFF):
        return None
    if not isinstance(choice, str) or choice not in KINDS:
        raise Refused(f"structured output must be one of {', '.join(CHOICES)}, not {str(choice)[:40]!r}", FIELD)
    kind = KINDS[choice]
    if kind == "json_object":
        return GuidedDecoding(kind)
    if not isinstance(spec, str) or not spec.strip():
        raise Refused(f"structured output {choice}: write the {choice} in the box beside it", FIELD)
    limit = min(max_chars, MAX_SPEC_CHARS)
    if len(spec) > limit:
        raise Refused(f"the {choice} is {len(spec):,} characters; this server takes at most {limit:,}", FIELD)
    try:
        spec.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused(f"the {choice} is not valid Unicode text (it contains a lone surrogate)", FIELD) from None
    if kind == "json_schema":
        _check_schema(spec)
    else:
        _check_regex(spec)
    return GuidedDecoding(kind, spec.strip() if kind == "json_schema" else spec)


def _check_schema(spec: str) -> None:
    try:
        schema = json.loads(spec)
    except json.JSONDecodeError as error:
        raise Refused(f"the JSON schema is not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})",
                      FIELD) from None
    if not isinstance(schema, dict):
        raise Refused("the JSON schema must be a JSON object, e.g. {\"type\": \"object\", \"properties\": {…}}",
                      FIELD)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        where = "/".join(str(part) for part in error.path)
        raise Refused(f"the JSON schema is not a valid JSON Schema{f' at {where}' if where else ''}: "
                      f"{error.message[:200]}", FIELD) from None


def _check_regex(spec: str) -> None:
    try:
        regex.compile(spec)
    except regex.error as error:
        raise Refused(f"the regex does not compile: {error}", FIELD) from None
