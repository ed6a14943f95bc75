"""Every remote-client test ends with no thread of the client left running (requests' threads, the watchdog)."""

from __future__ import annotations

import threading
import time

import pytest


def client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("remote-")]


@pytest.fixture(autouse=True)
def no_client_thread_left():
    yield
    deadline = time.monotonic() + 2.0
    while client_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not client_threads(), f"client threads left running: {client_threads()}"
