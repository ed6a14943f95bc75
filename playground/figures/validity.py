"""Whether a structured reply is what was asked for: the line under a reply sent with structured output.

Why checked again after the engine enforced it: the grammar keeps every token inside the language, but a reply can
still end early (max tokens, Stop, an error), and a person should see that the reply in front of them parses and
validates, checked by an independent implementation (`json` and `jsonschema`, `re.fullmatch`), not by the library
that guided it.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass

import jsonschema

ENDED_EARLY = {"length": "cut by max tokens (finish: length)", "cancelled": "stopped before it ended (finish: "
               "cancelled)", "error": "ended by an error (finish: error)"}


@dataclass(frozen=True)
class Validity:
    """The verdict on one reply: valid or not, and the line that says so (why not, when it is not)."""

    valid: bool
    text: str


def reply_validity(kind: str, spec: str, reply: str, finish_reason: str | None) -> Validity:
    """Check `reply` against the structured output it was sent with (`kind` and `spec` as in GuidedDecoding)."""
    if finish_reason in ENDED_EARLY:
        return Validity(False, f"✗ {ENDED_EARLY[finish_reason]}")
    if kind == "regex":
        return Validity(True, "✓ matches the regex") if re.fullmatch(spec, reply) else \
            Validity(False, "✗ does not match the regex")
    try:
        value = json.loads(reply)
    except json.JSONDecodeError as error:
        return Validity(False, f"✗ not JSON: {error.msg} at character {error.pos}")
    if kind == "json_object":
        return Validity(True, "✓ a JSON object") if isinstance(value, dict) else \
            Validity(False, f"✗ JSON, but a {type(value).__name__}, not an object")
    schema = json.loads(spec)
    error = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(value))
    if error is None:
        return Validity(True, "✓ valid against the schema")
    where = "/".join(str(part) for part in error.absolute_path) or "the top level"
    return Validity(False, f"✗ fails the schema at {where}: {error.message[:160]}")


def validity_html(validity: Validity) -> str:
    """The verdict as the line under the reply (green when valid, red when not)."""
    kind = "ok" if validity.valid else "bad"
    return f'<div class="reply-validity {kind}">{html.escape(validity.text, quote=False)}</div>'
