"""Which API calls may start: a bound on the calls in flight and on the tokens they may generate, overall and per
client.

Why: one call can ask for many sequences (a completion of 16 prompts of 256 tokens each, `n` choices of each), so
counting calls let one client queue hundreds of sequences ahead of everyone else. A call holds
`prompts x n x max_tokens` tokens from before it is tokenised until it ends (finished, failed, or its client gone);
a call that would take the calls past PLAYGROUND_MAX_CONCURRENT_CHATS + PLAYGROUND_MAX_QUEUE, the server's tokens
past PLAYGROUND_MAX_TOKENS_IN_FLIGHT, its client's tokens past PLAYGROUND_MAX_CLIENT_TOKENS_IN_FLIGHT or its
client's calls past a quarter of the calls (CLIENT_CALL_SHARE) gets 429 and costs nothing, so one client alone
cannot fill the bounds. A client is its address; behind a proxy, the last address of the header the proxy sets
(PLAYGROUND_CLIENT_ADDRESS_HEADER, `x-forwarded-for` on a Space), since that is the one the proxy itself saw.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from playground.api.errors import APIError

CLIENT_CALL_SHARE = 4  # one client may have this fraction (1/4) of the calls in flight


def client_address(request, header: str | None) -> str:
    """The address that identifies `request`'s client."""
    if header:
        forwarded = [part.strip() for part in request.headers.get(header, "").split(",") if part.strip()]
        if forwarded:
            return forwarded[-1]
    return request.client.host if request.client else "unknown"


@dataclass(frozen=True, eq=False)
class Ticket:
    """One admitted call: its client and the tokens it holds."""

    client: str
    tokens: int


class Admission:
    """Admits calls within the bounds; `leave(ticket)` gives a call's place and tokens back."""

    def __init__(self, max_calls: int, max_tokens: int, max_client_tokens: int):
        self.max_calls, self.max_tokens, self.max_client_tokens = max_calls, max_tokens, max_client_tokens
        self.max_client_calls = max(1, max_calls // CLIENT_CALL_SHARE)
        self._calls = 0
        self._client_calls: Counter[str] = Counter()
        self._tokens: Counter[str] = Counter()
        self._lock = threading.Lock()

    def admit(self, client: str, tokens: int) -> Ticket:
        """A ticket for a call of `client` that may generate `tokens`; APIError 429 beyond a bound (400 for a call
        that no bound could ever admit)."""
        if tokens > min(self.max_tokens, self.max_client_tokens):
            raise APIError(400, f"this request may generate {tokens:,} tokens (prompts x n x max_tokens), over the "
                                f"{min(self.max_tokens, self.max_client_tokens):,} one client may have in flight "
                                "here (PLAYGROUND_MAX_CLIENT_TOKENS_IN_FLIGHT): fewer prompts or a smaller max_tokens",
                           param="max_tokens")
        with self._lock:
            if self._calls >= self.max_calls:
                raise self._busy(f"the server is busy ({self.max_calls} requests in flight); retry shortly")
            if sum(self._tokens.values()) + tokens > self.max_tokens:
                raise self._busy(f"the server is busy (its requests in flight may generate {self.max_tokens:,} "
                                 "tokens, PLAYGROUND_MAX_TOKENS_IN_FLIGHT); retry shortly")
            if self._tokens[client] + tokens > self.max_client_tokens:
                raise self._busy(f"your requests in flight would ask for {self._tokens[client] + tokens:,} tokens, "
                                 f"over the {self.max_client_tokens:,} one client may have "
                                 "(PLAYGROUND_MAX_CLIENT_TOKENS_IN_FLIGHT, prompts x n x max_tokens); retry once some "
                                 "have finished")
            if self._client_calls[client] >= self.max_client_calls:
                raise self._busy(f"you have {self._client_calls[client]} requests in flight, the most one client may "
                                 "have here (a quarter of the server's); retry once some have finished")
            self._calls += 1
            self._client_calls[client] += 1
            self._tokens[client] += tokens
            return Ticket(client, tokens)

    def leave(self, ticket: Ticket) -> None:
        with self._lock:
            self._calls -= 1
            self._client_calls[ticket.client] -= 1
            self._tokens[ticket.client] -= ticket.tokens
            if not self._client_calls[ticket.client]:
                del self._client_calls[ticket.client], self._tokens[ticket.client]

    def in_flight(self) -> tuple[int, int]:
        """(calls, tokens) in flight now."""
        with self._lock:
            return self._calls, sum(self._tokens.values())

    @staticmethod
    def _busy(message: str) -> APIError:
        return APIError(429, message, kind="rate_limit_error", code="server_busy")
