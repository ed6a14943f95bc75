"""The server's measurement slot: one measurement at a time, sessions served in turn (one place each), a bounded
queue, and a time cap that stops the holder."""

from __future__ import annotations

import threading
import time

import pytest

from playground.shared.errors import Refused
from playground.shared.measurement_slot import MeasurementSlot


def test_sessions_take_turns_and_know_their_place():
    slot = MeasurementSlot(max_waiting=2)
    first, second, third = (slot.take(owner) for owner in ("a", "b", "c"))
    assert first.holding and not second.holding and (slot.ahead(second), slot.ahead(third)) == (1, 2)
    with pytest.raises(Refused, match="already has a measurement"):
        slot.take("a")  # one place per session: its own run, or its turn, not a second one
    with pytest.raises(Refused, match="PLAYGROUND_MAX_MEASURE_WAITING"):
        slot.take("d")
    slot.release(second)  # a waiting session that went away gives its place back
    assert slot.ahead(third) == 1
    slot.release(first)
    assert slot.wait_turn(third, 1.0) and slot.ahead(third) == 0
    slot.release(third)
    with slot.held("a") as place:
        assert place.holding


def test_a_waiting_place_is_woken_when_its_turn_comes():
    slot = MeasurementSlot(max_waiting=1)
    holder = slot.take("a")
    waiting = slot.take("b")
    threading.Timer(0.2, slot.release, args=(holder,)).start()
    started = time.monotonic()
    assert slot.wait_turn(waiting, 5.0) and time.monotonic() - started < 2


def test_the_time_cap_stops_the_holder_only():
    slot = MeasurementSlot(max_waiting=1, max_seconds=0.3)
    holder, waiting = slot.take("a"), slot.take("b")
    assert holder.cancel.wait(5) and holder.capped
    assert not waiting.cancel.is_set() and not waiting.capped
    slot.release(holder)
    assert waiting.holding and waiting.cancel.wait(5)  # its own cap starts when its turn does
    unbounded = MeasurementSlot(max_waiting=1)
    place = unbounded.take("a")
    assert not place.cancel.wait(0.5)
