"""`EnginePool`: engines kept by configuration, shared by every session that uses it.

Why: an engine batches all the requests it is given, so sessions with the same configuration
must share one engine to be batched together; and engines are big, so the pool keeps as many as
a memory budget allows and evicts the least recently used idle one. An engine in use (leased by
a running request or a load in progress) is never closed.

The pool is generic over the engine: it is given a factory (config -> engine), a key function
(config -> hashable), a size function (engine -> bytes) and a close function.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

C = TypeVar("C")
E = TypeVar("E")


@dataclass
class PooledEngine(Generic[E]):
    """One engine in the pool with its bookkeeping."""

    key: Hashable
    engine: E
    size_bytes: int
    load_seconds: float
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class PoolEntryInfo:
    """A read-only view of a pooled engine, for display."""

    key: Hashable
    size_bytes: int
    users: int
    idle_seconds: float
    load_seconds: float


class _Loading:
    """A load in progress: other sessions asking for the same key wait on it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.entry: PooledEngine | None = None
        self.error: BaseException | None = None
        self.waiters = 0


class EnginePool(Generic[C, E]):
    """Engines by configuration, under a memory budget, evicted least-recently-used when idle."""

    def __init__(
        self,
        factory: Callable[[C], E],
        *,
        key: Callable[[C], Hashable],
        size_of: Callable[[E], int],
        close: Callable[[E], Any],
        memory_budget_bytes: int | None = None,
        max_engines: int = 3,
    ) -> None:
        if max_engines < 1:
            raise ValueError("max_engines must be >= 1")
        self._factory = factory
        self._key = key
        self._size_of = size_of
        self._close = close
        self.memory_budget_bytes = memory_budget_bytes
        self.max_engines = max_engines
        self._entries: OrderedDict[Hashable, PooledEngine[E]] = OrderedDict()
        self._loading: dict[Hashable, _Loading] = {}
        self._lock = threading.Lock()

    @contextmanager
    def lease(self, config: C) -> Iterator[PooledEngine[E]]:
        """Hold the engine for `config` (loading it if needed) for the duration of the block.

        A failed load raises the factory's exception and changes nothing else in the pool.
        """
        entry = self._acquire(config)
        try:
            yield entry
        finally:
            self._release(entry)

    @contextmanager
    def lease_if_loaded(self, config: C) -> Iterator[PooledEngine[E] | None]:
        """Like `lease`, but yields None instead of loading an engine that is not in the pool."""
        with self._lock:
            entry = self._entries.get(self._key(config))
            if entry is not None:
                entry.users += 1
        if entry is None:
            yield None
            return
        try:
            yield entry
        finally:
            self._release(entry)

    def is_loaded(self, config: C) -> bool:
        with self._lock:
            return self._key(config) in self._entries

    def entries(self) -> list[PoolEntryInfo]:
        """Loaded engines, most recently used last."""
        now = time.monotonic()
        with self._lock:
            return [PoolEntryInfo(e.key, e.size_bytes, e.users, now - e.last_used, e.load_seconds)
                    for e in self._entries.values()]

    def total_bytes(self) -> int:
        with self._lock:
            return sum(e.size_bytes for e in self._entries.values())

    def close(self) -> None:
        """Close every engine that is not in use; in-use engines close when released."""
        with self._lock:
            victims = [self._entries.pop(k) for k, e in list(self._entries.items()) if e.users == 0]
            self.max_engines = 0
        for victim in victims:
            self._close(victim.engine)

    def _acquire(self, config: C) -> PooledEngine[E]:
        key = self._key(config)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.users += 1
                entry.last_used = time.monotonic()
                self._entries.move_to_end(key)
                return entry
            loading = self._loading.get(key)
            if loading is None:
                loading = self._loading[key] = _Loading()
                owner = True
            else:
                loading.waiters += 1
                owner = False
        if not owner:
            loading.done.wait()
            if loading.error is not None:
                raise loading.error
            return loading.entry
        return self._load(key, config, loading)

    def _load(self, key: Hashable, config: C, loading: _Loading) -> PooledEngine[E]:
        started = time.perf_counter()
        try:
            engine = self._factory(config)
        except BaseException as exc:
            with self._lock:
                del self._loading[key]
            loading.error = exc
            loading.done.set()
            raise
        entry = PooledEngine(key=key, engine=engine, size_bytes=int(self._size_of(engine)),
                             load_seconds=time.perf_counter() - started)
        with self._lock:
            entry.users = 1 + loading.waiters  # the waiters hold it too, before anyone can evict it
            self._entries[key] = entry
            del self._loading[key]
            loading.entry = entry
            victims = self._evict_locked()
        loading.done.set()
        for victim in victims:
            self._close(victim.engine)
        return entry

    def _release(self, entry: PooledEngine[E]) -> None:
        with self._lock:
            entry.users -= 1
            entry.last_used = time.monotonic()
            victims = self._evict_locked()
        for victim in victims:
            self._close(victim.engine)

    def _evict_locked(self) -> list[PooledEngine[E]]:
        """Pop idle engines, least recently used first, until count and memory fit the limits.

        Runs after a load succeeds (never before: a failed load must leave what is serving in
        place) and whenever a lease ends.
        """
        victims = []
        max_count = self.max_engines
        for key in list(self._entries):
            entry = self._entries[key]
            over_count = len(self._entries) > max_count
            over_memory = (self.memory_budget_bytes is not None
                           and sum(e.size_bytes for e in self._entries.values()) > self.memory_budget_bytes)
            if not (over_count or over_memory):
                break
            if entry.users == 0:
                victims.append(self._entries.pop(key))
        return victims
