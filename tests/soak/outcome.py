"""What one request of the soak got back, and the judgement of a refusal: one 4xx error in OpenAI's format that says
what is wrong, names the field at fault and leaks nothing of the server.

Why a module: the soak's visitors (`harness.py`) and its attackers (`attacks.py`) are judged the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tests.support.paths import PROJECT_ROOT

NO_FIELD = "-"  # a refusal of the whole body (not JSON, not an object): no field to name


@dataclass
class Outcome:
    """What one job got back, and what was wrong with it (None when it was right)."""

    index: int
    kind: str
    seconds: float = 0.0
    status: int = 0
    finish: str = ""
    output_tokens: int = 0
    asked_tokens: int = 0  # tokens asked for by a client that then left (its requests must be cancelled)
    problem: str | None = None
    error: str = ""


def refusal_problem(status: int, raw: bytes, expect: str, field: str) -> tuple[str, str | None]:
    """(the error message, why the refusal is wrong or None): a 4xx whose message says `expect` and whose `param`
    is `field` (None for NO_FIELD), with no traceback or server path in it."""
    try:
        error = json.loads(raw)["error"]
        message = error["message"]
    except (ValueError, KeyError, TypeError):
        return "", f"HTTP {status} without an error message: {raw[:200]!r}"
    if not 400 <= status < 500:
        return message, f"HTTP {status} for a bad request: {message}"
    if expect.lower() not in message.lower():
        return message, f"the error does not say {expect!r}: {message}"
    if error.get("param") != (None if field == NO_FIELD else field):
        return message, f"the error names {error.get('param')!r}, not {field!r}: {message}"
    if "Traceback" in message or str(PROJECT_ROOT) in message:
        return message, f"the error leaks internals: {message}"
    return message, None
