"""The server's one measurement slot: Compare, Benchmark, the Roofline probe and the perplexity button measure one at
a time, sessions take turns, and a measurement holds the slot for a bounded time.

Why: a measurement means something only when nothing else measures meanwhile, so the server runs one at a time; and a
slot every visitor shares must not be one visitor's to keep. Each session holds at most one place (measuring or
waiting), places are served in the order they were taken, a waiting place knows how many are ahead of it (the page
and the API show it), and at most `max_waiting` places wait (beyond that a new one is refused). With `max_seconds`
(public mode) a place that has held the slot that long has its `cancel` event set: its measurement stops and ends
with what finished. A place is given back when its measurement ends, or when its session goes away while it waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from playground.shared.errors import Refused


class Place:
    """One session's place: waiting, then holding the slot until it is released."""

    def __init__(self, owner: object):
        self.owner = owner
        self.cancel = threading.Event()  # set by the time cap (or by whoever stops the measurement)
        self.capped = False  # the time cap stopped it
        self.held_since: float | None = None
        self._timer: threading.Timer | None = None

    @property
    def holding(self) -> bool:
        return self.held_since is not None


class MeasurementSlot:
    """Hands the slot to one place at a time, oldest first."""

    def __init__(self, max_waiting: int, max_seconds: float | None = None):
        self.max_waiting = max_waiting
        self.max_seconds = max_seconds
        self._places: list[Place] = []  # the holder first, then the waiting places in order
        self._changed = threading.Condition()

    def take(self, owner: object) -> Place:
        """A place for `owner` (a session); Refused if it already has one or too many places wait."""
        with self._changed:
            if any(place.owner is owner for place in self._places):
                raise Refused("this session already has a measurement running or waiting: wait for it or stop it")
            if len(self._places) > self.max_waiting:
                raise Refused(f"{len(self._places) - 1} measurements are already waiting for this server's "
                              "measurement slot (PLAYGROUND_MAX_MEASURE_WAITING): try again in a moment")
            place = Place(owner)
            self._places.append(place)
            self._hand_over()
            return place

    def ahead(self, place: Place) -> int:
        """How many places come before `place` (0 once it holds the slot)."""
        with self._changed:
            return self._places.index(place) if place in self._places else 0

    def wait_turn(self, place: Place, timeout: float) -> bool:
        """Wait up to `timeout` seconds for `place` to hold the slot; whether it does."""
        with self._changed:
            return self._changed.wait_for(lambda: place.holding, timeout)

    def release(self, place: Place) -> None:
        """Give the place back (holding or waiting); the next place, if any, takes the slot."""
        with self._changed:
            if place._timer is not None:
                place._timer.cancel()
            if place in self._places:
                self._places.remove(place)
                self._hand_over()

    @contextmanager
    def held(self, owner: object) -> Iterator[Place]:
        """Take a place, wait (blocking) for the slot, hold it for the block, then give it back."""
        place = self.take(owner)
        try:
            while not self.wait_turn(place, 1.0):
                pass
            yield place
        finally:
            self.release(place)

    def _hand_over(self) -> None:
        """The first place holds the slot (called with the condition held)."""
        if self._places and not self._places[0].holding:
            holder = self._places[0]
            holder.held_since = time.monotonic()
            if self.max_seconds:
                holder._timer = threading.Timer(self.max_seconds, self._expire, args=(holder,))
                holder._timer.daemon = True
                holder._timer.start()
        self._changed.notify_all()

    @staticmethod
    def _expire(place: Place) -> None:
        place.capped = True
        place.cancel.set()
