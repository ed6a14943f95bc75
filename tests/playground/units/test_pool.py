"""`EnginePool` without an engine: one engine per configuration, loads shared and reserved, the memory budget,
eviction of idle engines only."""

from __future__ import annotations

import threading
import time

import pytest

from playground.shared.pool import EnginePool, OverBudget


class DummyEngine:
    def __init__(self, config):
        if config.get("fail"):
            raise ValueError(f"cannot load {config['name']}")
        self.name = config["name"]
        self.size = config.get("size", 10)
        self.closed = False

    def close(self):
        self.closed = True


def make_pool(**kwargs):
    loads = []

    def factory(config):
        loads.append(config["name"])
        time.sleep(config.get("delay", 0))
        return DummyEngine(config)

    pool = EnginePool(factory, key=lambda c: c["name"], size_of=lambda e: e.size, close=DummyEngine.close,
                      estimate=lambda c: c.get("size", 10), **kwargs)
    return pool, loads


def test_pool_shares_one_engine_per_configuration():
    pool, loads = make_pool()
    with pool.lease({"name": "a"}) as first, pool.lease({"name": "a"}) as second:
        assert first.engine is second.engine and first.users == 2
    assert loads == ["a"]


def test_pool_loads_once_when_many_sessions_ask_at_the_same_time():
    pool, loads = make_pool()
    engines = []

    def ask():
        with pool.lease({"name": "a", "delay": 0.2}) as entry:
            engines.append(entry.engine)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert loads == ["a"] and len({id(e) for e in engines}) == 1


def test_pool_evicts_least_recently_used_idle_engine():
    pool, _ = make_pool(max_engines=2)
    for name in ("a", "b", "a", "c"):
        with pool.lease({"name": name}):
            pass
    assert [e.key for e in pool.entries()] == ["a", "c"]  # b was least recently used


def test_pool_evicts_idle_engines_before_loading_to_make_room():
    pool, loads = make_pool(memory_budget_bytes=25, max_engines=10)
    engines = {}
    for name in ("a", "b"):
        with pool.lease({"name": name}) as entry:
            engines[name] = entry.engine
    phases = []
    with pool.lease({"name": "c"}, on_phase=phases.append):
        assert engines["a"].closed and not engines["b"].closed  # evicted before c loaded, not after
    assert phases == ["sizing", "loading"] and [e.key for e in pool.entries()] == ["b", "c"]


def test_pool_refuses_an_over_budget_load_before_the_factory_runs():
    pool, loads = make_pool(memory_budget_bytes=25, max_engines=10)
    with pool.lease({"name": "a"}) as serving:
        with pytest.raises(OverBudget, match="more than this server's engine memory budget"):
            with pool.lease({"name": "huge", "size": 30}):
                pass
        with pytest.raises(OverBudget, match="engines serving requests hold"):  # a is busy: cannot be evicted
            with pool.lease({"name": "b", "size": 20}):
                pass
        assert not serving.engine.closed
    assert loads == ["a"], "the factory ran for a load that could not fit"


def test_pool_reserves_memory_for_loads_in_progress():
    pool, loads = make_pool(memory_budget_bytes=25, max_engines=10)
    errors = []

    def load(name):
        try:
            with pool.lease({"name": name, "size": 15, "delay": 0.3}):
                time.sleep(0.2)
        except OverBudget as error:
            errors.append(error)

    threads = [threading.Thread(target=load, args=(n,)) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loads) == 1 and len(errors) == 1, "two loads that together exceed the budget both started"


def test_pool_never_closes_an_engine_under_a_running_request():
    pool, _ = make_pool(max_engines=1)
    with pool.lease({"name": "a"}) as running:
        with pool.lease({"name": "b"}) as other:
            assert len(pool.entries()) == 2
        assert not running.engine.closed and other.engine.closed
    with pool.lease({"name": "c"}):
        pass
    assert running.engine.closed and [e.key for e in pool.entries()] == ["c"]


def test_pool_failed_load_leaves_the_serving_engine_in_place():
    pool, _ = make_pool(max_engines=1)
    with pool.lease({"name": "a"}) as entry:
        serving = entry.engine
    with pytest.raises(ValueError, match="cannot load b"):
        with pool.lease({"name": "b", "fail": True}):
            pass
    assert [e.key for e in pool.entries()] == ["a"] and not serving.closed
    with pool.lease_if_loaded({"name": "zzz"}) as missing:
        assert missing is None
