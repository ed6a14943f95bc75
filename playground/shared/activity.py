"""`SessionActivity`: this session's own requests on its engine, as the live charts draw them apart.

Why apart from the charts: the session records its requests while a reply streams (the chat's
handlers), and the engine-wide charts read the record to show this session's share of an engine
that batches every session using its configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SessionActivity:
    """This session's own requests on the engine: when each ran and when its tokens arrived."""

    token_events: list[tuple[float, int]] = field(default_factory=list)  # (perf_counter time, tokens)
    requests: list[list[float | None]] = field(default_factory=list)  # [start, end or None while running]

    def request_started(self, now: float) -> None:
        self.requests.append([now, None])

    def tokens_arrived(self, now: float, count: int) -> None:
        if count:
            self.token_events.append((now, count))

    def request_ended(self, now: float) -> None:
        if self.requests and self.requests[-1][1] is None:
            self.requests[-1][1] = now

    def trim(self, now: float, window_s: float) -> None:
        """Forget what ended more than `window_s` seconds ago."""
        self.token_events = [e for e in self.token_events if now - e[0] < window_s]
        self.requests = [r for r in self.requests if r[1] is None or now - r[1] < window_s]
