"""Deadlines of the remote calls in flight, enforced from one thread that ends when none is left.

Why: a per-read timeout bounds the gap between two bytes, not the time to the first token (a server may send its
headers, a role chunk or keep-alive comments and then nothing useful), and a stalled read does not wake when another
thread closes its socket. The watchdog calls each expired entry's `on_expiry`, which shuts the call's socket down:
that wakes the blocked read at once, and the reading thread reports the timeout.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from engine.core.threads import start_helper_thread


class Watchdog:
    """`arm(key, deadline, on_expiry)` (a `time.monotonic()` deadline; arming again moves it), `disarm(key)`.

    Arming is called for every streamed chunk, so it wakes the thread only for a deadline earlier than the one it
    sleeps until (a moved-out deadline is found when that wait ends), and disarming only when nothing is left."""

    def __init__(self, name: str = "remote-watchdog"):
        self._name = name
        self._wakeup = threading.Condition()
        self._entries: dict[object, tuple[float, Callable[[], None]]] = {}
        self._running = False
        self._sleeping_until = math.inf

    def arm(self, key: object, deadline: float, on_expiry: Callable[[], None]) -> None:
        with self._wakeup:
            self._entries[key] = (deadline, on_expiry)
            if not self._running:
                self._running = True
                start_helper_thread(self._run, self._name)
            elif deadline < self._sleeping_until:
                self._wakeup.notify()

    def disarm(self, key: object) -> None:
        with self._wakeup:
            if self._entries.pop(key, None) is not None and not self._entries:
                self._wakeup.notify()

    def _run(self) -> None:
        while True:
            with self._wakeup:
                if not self._entries:
                    self._running = False
                    return
                now = time.monotonic()
                expired = [key for key, (deadline, _) in self._entries.items() if deadline <= now]
                callbacks = [self._entries.pop(key)[1] for key in expired]
                if not callbacks:
                    self._sleeping_until = min(deadline for deadline, _ in self._entries.values())
                    self._wakeup.wait(self._sleeping_until - now)
                    self._sleeping_until = math.inf
            for callback in callbacks:
                callback()
