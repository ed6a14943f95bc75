"""`EnginePool`: engines kept by configuration, shared by every session that uses it.

Why: an engine batches all the requests it is given, so sessions with the same configuration
must share one engine to be batched together; and engines are big, so the pool keeps as many as
a memory budget allows and evicts the least recently used idle one. An engine in use (leased by
a running request or a load in progress) is never closed. A load that would not fit the budget
is refused before it allocates anything: its size is estimated first, idle engines are evicted
to make room, and what loads in parallel is reserved so that two loads cannot both squeeze in.

The pool is generic over the engine: it is given a factory (config -> engine), a size function
(engine -> bytes), a close function, and optionally a key function (config -> hashable; by default
the configuration itself, e.g. a frozen `EngineConfig`) and an estimate function (config -> bytes,
before loading).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from playground.shared.errors import Refused

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
class PoolEntryInfo(Generic[E]):
    """A read-only view of a pooled engine, for display."""

    key: Hashable
    engine: E
    size_bytes: int
    users: int
    idle_seconds: float
    load_seconds: float


class OverBudget(Refused):
    """Loading this configuration would take more memory than the pool may use."""


def _itself(config: Hashable) -> Hashable:
    return config


def _mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:,.0f} MiB"


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
        size_of: Callable[[E], int],
        close: Callable[[E], Any],
        key: Callable[[C], Hashable] | None = None,
        estimate: Callable[[C], int] | None = None,
        memory_budget_bytes: int | None = None,
        max_engines: int = 3,
    ) -> None:
        if max_engines < 1:
            raise ValueError("max_engines must be >= 1")
        self._factory = factory
        self._key = key or _itself
        self._size_of = size_of
        self._close = close
        self._estimate = estimate
        self.memory_budget_bytes = memory_budget_bytes
        self.max_engines = max_engines
        self._entries: OrderedDict[Hashable, PooledEngine[E]] = OrderedDict()
        self._loading: dict[Hashable, _Loading] = {}
        self._reserved: dict[Hashable, int] = {}  # estimated bytes of loads in progress
        self._lock = threading.Lock()

    @contextmanager
    def lease(self, config: C, on_phase: Callable[[str], Any] | None = None) -> Iterator[PooledEngine[E]]:
        """Hold the engine for `config` (loading it if needed) for the duration of the block.

        `on_phase` hears "waiting" (another caller is loading the same configuration), "sizing"
        (estimating its memory) and "loading" (the factory runs). A load over the memory budget
        raises `OverBudget` before the factory runs; a failed load raises the factory's exception.
        Either way the engines that were serving keep serving (idle ones may have been evicted to
        make room).
        """
        entry = self.acquire(config, on_phase)
        try:
            yield entry
        finally:
            self.release(entry)

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
            self.release(entry)

    def is_loaded(self, config: C) -> bool:
        with self._lock:
            return self._key(config) in self._entries

    def entries(self) -> list[PoolEntryInfo]:
        """Loaded engines, most recently used last."""
        now = time.monotonic()
        with self._lock:
            return [PoolEntryInfo(e.key, e.engine, e.size_bytes, e.users, now - e.last_used, e.load_seconds)
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

    def acquire(self, config: C, on_phase: Callable[[str], Any] | None = None) -> PooledEngine[E]:
        """The engine for `config`, held until `release` (prefer `lease`, which cannot forget to)."""
        on_phase = on_phase or (lambda phase: None)
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
            on_phase("waiting")
            loading.done.wait()
            if loading.error is not None:
                raise loading.error
            return loading.entry
        return self._load(key, config, loading, on_phase)

    def _load(self, key: Hashable, config: C, loading: _Loading, on_phase: Callable[[str], Any]) -> PooledEngine[E]:
        started = time.perf_counter()
        victims: list[PooledEngine[E]] = []
        try:
            if self._estimate is not None:
                on_phase("sizing")
                victims = self._reserve(key, int(self._estimate(config)))
            for victim in victims:
                self._close(victim.engine)
            on_phase("loading")
            engine = self._factory(config)
        except BaseException as exc:
            with self._lock:
                del self._loading[key]
                self._reserved.pop(key, None)
            loading.error = exc
            loading.done.set()
            raise
        entry = PooledEngine(key=key, engine=engine, size_bytes=int(self._size_of(engine)),
                             load_seconds=time.perf_counter() - started)
        with self._lock:
            entry.users = 1 + loading.waiters  # the waiters hold it too, before anyone can evict it
            self._entries[key] = entry
            del self._loading[key]
            self._reserved.pop(key, None)
            loading.entry = entry
            victims = self._evict_locked()
        loading.done.set()
        for victim in victims:
            self._close(victim.engine)
        return entry

    def _reserve(self, key: Hashable, needed: int) -> list[PooledEngine[E]]:
        """Reserve `needed` bytes for a load, evicting idle engines (least recently used first) to make room.

        Raises OverBudget, evicting nothing, when even evicting every idle engine would not make room.
        """
        with self._lock:
            budget = self.memory_budget_bytes
            if budget is None:
                self._reserved[key] = needed
                return []
            if needed > budget:
                raise OverBudget(f"this configuration needs about {_mib(needed)} (weights + KV cache), more than "
                                 f"this server's engine memory budget of {_mib(budget)}; lower kv_cache_bytes, "
                                 "max_num_seqs or max_model_len, or pick a smaller model")
            in_use = sum(e.size_bytes for e in self._entries.values()) + sum(self._reserved.values())
            idle = [k for k, e in self._entries.items() if e.users == 0]
            freeable = sum(self._entries[k].size_bytes for k in idle)
            if in_use + needed - freeable > budget:
                raise OverBudget(f"this configuration needs about {_mib(needed)}, but engines serving requests "
                                 f"hold {_mib(in_use - freeable)} of the {_mib(budget)} budget; try again when "
                                 "they are idle, or pick a smaller configuration")
            victims = []
            for victim_key in idle:
                if in_use + needed <= budget:
                    break
                victim = self._entries.pop(victim_key)
                in_use -= victim.size_bytes
                victims.append(victim)
            self._reserved[key] = needed
            return victims

    def release(self, entry: PooledEngine[E]) -> None:
        with self._lock:
            entry.users -= 1
            entry.last_used = time.monotonic()
            victims = self._evict_locked()
        for victim in victims:
            self._close(victim.engine)

    def _evict_locked(self) -> list[PooledEngine[E]]:
        """Pop idle engines, least recently used first, until count and memory fit the limits.

        Runs after a load succeeds and whenever a lease ends (before a load, `_reserve` evicts only
        what the memory budget requires).
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
