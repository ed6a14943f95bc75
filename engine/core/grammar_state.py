"""`RequestGrammar`: one request's place in its grammar, advanced by every token the request emits.

Wraps an llguidance matcher. llguidance never raises for a grammar-level problem: a rejected token or an
exhausted limit puts the matcher in an error state, which is turned here into a `GuidedDecodingError` so the
engine fails that request alone.
"""

from __future__ import annotations

import llguidance


class GuidedDecodingError(RuntimeError):
    """The request's grammar cannot go on (a token it rejects, a parser limit reached)."""


class RequestGrammar:
    """A request's grammar state: which tokens may come next, and whether the output is complete."""

    def __init__(self, matcher: llguidance.LLMatcher):
        self.matcher = matcher

    def advance(self, token: int) -> bool:
        """Take an emitted token; True once the grammar is complete (nothing but the end may follow)."""
        if not self.matcher.consume_token(token):
            raise GuidedDecodingError(f"the grammar rejected token {token}: {self.error()}")
        return self.matcher.is_stopped()

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many leading `tokens` the grammar would accept from here (the state does not change)."""
        return self.matcher.validate_tokens(tokens) if tokens else 0

    def error(self) -> str | None:
        """Why the grammar cannot go on, or None while it can."""
        return self.matcher.get_error() if self.matcher.is_error() else None
