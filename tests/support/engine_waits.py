"""Waiting for the engine loop, which runs on its own thread.

A caller's result arrives once its request's KV blocks are free, but other requests (cancelled ones, those of
other threads) may still be running or being released; figures about the whole engine are read once it is idle.
"""

from __future__ import annotations

import time

from engine import Engine


def wait_until_idle(engine: Engine, timeout: float = 10.0, kv_free: bool = True) -> dict:
    """An engine's stats once nothing runs or waits and (with `kv_free`) every KV block is back in the pool.

    Pass `kv_free=False` for the transformers backend: its paged cache keeps finished requests' blocks for its own
    prefix sharing, so its KV in use does not return to zero when its requests end.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = engine.stats()
        blocks_back = stats.kv_cache_used_bytes == 0 or not kv_free
        if stats.num_running == 0 and stats.num_waiting == 0 and blocks_back:
            return stats
        time.sleep(0.01)
    raise AssertionError("engine did not become idle")


def wait_for_steps(engine: Engine, since: float, count: int, timeout: float = 30.0) -> None:
    """Return once the engine has run `count` steps after `since` (a `time.perf_counter()` value)."""
    deadline = time.monotonic() + timeout
    while len(engine.step_history(since=since)) < count:
        assert time.monotonic() < deadline, f"the engine ran fewer than {count} steps in {timeout} s"
        time.sleep(0.002)
