"""Structured outputs on the OpenAI routes: `response_format` and vLLM's guided fields, as one `GuidedDecoding`.

Why: OpenAI's `response_format` (`json_object`, `json_schema`) and vLLM's extensions (`guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar`, and their newer form `structured_outputs`) all ask for the same
thing, a grammar the reply must follow while it is decoded. Each becomes the engine's `GuidedDecoding`, checked
here for shape and size before the call is admitted (a spec over the engine's MAX_SPEC_CHARS is never compiled),
then compiled by `Engine.check_guided` (cached, time-bounded) before the request is queued, so a bad regex or a
schema keyword the grammar library cannot enforce is a 400 naming the field. One constraint per call: two are
refused rather than one silently winning. `strict: false` is enforced like `strict: true`, as vLLM does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from engine import MAX_SPEC_CHARS, GuidedDecoding
from playground.api.errors import APIError

GUIDED_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                 "structured_outputs")
STRUCTURED_OUTPUTS_KEYS = ("json", "regex", "choice", "grammar", "json_object")
MAX_CHOICES = 64


@dataclass(frozen=True)
class Constraint:
    """A call's guided decoding and the request field it came from (named in any refusal of it)."""

    field: str
    guided: GuidedDecoding


def parse_constraint(body: dict) -> Constraint | None:
    """The one grammar the call's fields ask for (None when none does); APIError 400 naming the field at fault."""
    found = [(name, _guided(name, body[name])) for name in GUIDED_FIELDS if body.get(name) is not None]
    found = [(name, guided) for name, guided in found if guided is not None]
    if len(found) > 1:
        raise APIError(400, f"{found[0][0]} and {found[1][0]} both constrain the reply; send one",
                       param=found[1][0])
    if not found:
        return None
    name, guided = found[0]
    check_spec(name, guided.spec)
    return Constraint(name, guided)


def check_spec(name: str, spec: str) -> None:
    """APIError 400 naming `name` for a spec too long to compile here or not valid Unicode (a lone surrogate)."""
    if len(spec) > MAX_SPEC_CHARS:
        raise APIError(400, f"{name} is {len(spec):,} characters as JSON; this server compiles at most "
                            f"{MAX_SPEC_CHARS:,}", param=name)
    try:
        spec.encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(400, f"{name} is not valid Unicode text (it contains a lone surrogate)", param=name) from None


def _guided(name: str, value, param: str | None = None) -> GuidedDecoding | None:
    """`value` of the field `name` (or of `structured_outputs`' key of that name: then `param` is that field)."""
    param = param or name
    if name == "response_format":
        return _response_format(value)
    if name == "structured_outputs":
        if not isinstance(value, dict):
            raise APIError(400, "structured_outputs must be an object", param=name)
        given = [key for key in STRUCTURED_OUTPUTS_KEYS if value.get(key) not in (None, False)]
        unknown = sorted(set(value) - set(STRUCTURED_OUTPUTS_KEYS))
        if unknown or len(given) != 1:
            raise APIError(400, f"structured_outputs takes exactly one of {', '.join(STRUCTURED_OUTPUTS_KEYS)}"
                                + (f" (not {unknown[0][:40]!r})" if unknown else ""), param=name)
        key = given[0]
        return GuidedDecoding("json_object") if key == "json_object" else _guided(f"guided_{key}", value[key], name)
    if name == "guided_json":
        return _schema(param, value)
    if name == "guided_choice":
        if (not isinstance(value, list) or not value or len(value) > MAX_CHOICES
                or not all(isinstance(c, str) and c for c in value)):
            raise APIError(400, f"{param} must be a list of 1 to {MAX_CHOICES} non-empty strings", param=param)
        return GuidedDecoding("regex", "|".join(f"({re.escape(choice)})" for choice in value))
    if not isinstance(value, str) or not value.strip():
        raise APIError(400, f"{param} must be a non-empty string", param=param)
    return GuidedDecoding("regex" if name == "guided_regex" else "grammar", value)


def _response_format(value) -> GuidedDecoding | None:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text" and set(value) == {"type"}:
        return None
    if kind == "json_object" and set(value) == {"type"}:
        return GuidedDecoding("json_object")
    if kind == "json_schema" and set(value) == {"type", "json_schema"} and isinstance(value["json_schema"], dict):
        spec = value["json_schema"]
        extra = sorted(set(spec) - {"name", "schema", "strict", "description"})
        if extra or not isinstance(spec.get("name"), str) or not isinstance(spec.get("strict", False), bool | None):
            raise APIError(400, "response_format.json_schema takes name, schema, strict and description"
                                + (f" (not {extra[0][:40]!r})" if extra else ""), param="response_format")
        return _schema("response_format", spec.get("schema", {}))
    raise APIError(400, 'response_format must be {"type": "text"}, {"type": "json_object"} or {"type": '
                        '"json_schema", "json_schema": {"name": ..., "schema": {...}}}', param="response_format")


def _schema(name: str, schema) -> GuidedDecoding:
    if isinstance(schema, str):  # vLLM takes a schema as JSON text too
        try:
            schema = json.loads(schema)
        except ValueError:
            raise APIError(400, f"{name} is not a JSON schema: not JSON", param=name) from None
    if not isinstance(schema, dict):
        raise APIError(400, f"{name} must be a JSON schema (an object)", param=name)
    return GuidedDecoding("json_schema", json.dumps(schema, ensure_ascii=False))
