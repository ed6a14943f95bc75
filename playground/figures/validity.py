"""Whether a structured reply is what was asked for: the line under a reply sent with structured output.

Why checked again after the engine enforced it: the grammar keeps every token inside the language, but a reply can
still end early (max tokens, Stop, an error), and a person should see that the reply in front of them parses and
validates, checked by an independent implementation (`json` and `jsonschema`, a regex full match), not by the
library that guided it. The regex is anyone's, so its match runs under a time bound (the `regex` package's timeout):
a pattern that backtracks catastrophically costs this server at most REGEX_CHECK_S.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass

import jsonschema
import regex

REGEX_CHECK_S = 1.0
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
        return _regex_validity(spec, reply)
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


def _regex_validity(spec: str, reply: str, timeout_s: float = REGEX_CHECK_S) -> Validity:
    try:
        matched = regex.fullmatch(spec, reply, timeout=timeout_s)
    except TimeoutError:
        return Validity(False, f"? not checked: matching the regex took over {timeout_s:g} s")
    return Validity(True, "✓ matches the regex") if matched else Validity(False, "✗ does not match the regex")


def validity_html(validity: Validity) -> str:
    """The verdict as the line under the reply (green when valid, red when not)."""
    kind = "ok" if validity.valid else "bad"
    return f'<div class="reply-validity {kind}">{html.escape(validity.text, quote=False)}</div>'
