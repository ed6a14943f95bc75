"""Engines over worker processes in tests: the prompts their outputs are compared on, this process's children and
listening ports, waiting for them to go, and collecting outputs within a deadline (tensor-parallel ranks, pipeline
stages and disaggregated workers alike)."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import torch

from engine import Engine, SamplingParams
from tests.support.tiny_models import VOCAB

MAX_TOKENS = 10
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
SHARED = [int(t) for t in torch.randint(3, VOCAB, (24,), generator=torch.Generator().manual_seed(3))]
# short, long, two sharing a 24-token prefix (prefix caching), and a repeated token
PROMPTS = [[5, 6, 7], list(range(10, 70)), SHARED + [1, 2], SHARED + [9], [100] * 30]


def greedy(engine: Engine, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    """Each prompt's generated token ids, every request run to its length."""
    outputs = engine.generate(prompts, params)
    assert all(o.finish_reason == "length" for o in outputs), [o.error for o in outputs]
    return [o.token_ids for o in outputs]


def children() -> set[int]:
    """Child processes of this test process, the multiprocessing resource tracker aside (it lives as long as we do)."""
    pids = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if not any("resource_tracker" in part for part in child.cmdline()):
                pids.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def listening_ports() -> set[int]:
    return {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def describe(*pids: int) -> str:
    """Each process's state, and each of its threads' signal masks and pending signals, for a failure message."""
    states = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            threads = []
            for thread in process.threads():
                with open(f"/proc/{pid}/task/{thread.id}/status") as status:
                    sig = {k: v.strip() for k, _, v in (line.partition(":") for line in status)
                           if k in ("SigIgn", "SigBlk", "SigPnd", "ShdPnd")}
                with open(f"/proc/{pid}/task/{thread.id}/wchan") as wchan:
                    threads.append(f"{thread.id} {wchan.read()} {sig}")
            states.append(f"{pid} {process.status()}: " + ", ".join(threads))
        except (psutil.NoSuchProcess, FileNotFoundError):
            states.append(f"{pid}: gone")
    return "; ".join(states)


def all_gone(pids: list[int]):
    return lambda: all(gone(pid) for pid in pids)


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def results_within(handles, seconds: float) -> list:
    """Every handle's output, or TimeoutError once `seconds` have passed (never waits longer)."""
    pool = ThreadPoolExecutor(len(handles))
    try:
        futures = [pool.submit(handle.result) for handle in handles]
        deadline = time.monotonic() + seconds
        return [future.result(timeout=max(0.0, deadline - time.monotonic())) for future in futures]
    finally:
        pool.shutdown(wait=False)


def close_and_check_nothing_left(engine: Engine, pids: list[int], before_children: set[int],
                                 before_ports: set[int]) -> None:
    """Kill whatever of `pids` is still there, close the engine, and check that no process or listening port of
    it is left (call in a `finally`)."""
    for pid in pids:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)
    engine.close()
    assert wait_until(all_gone(pids), 5)
    assert children() <= before_children
    assert listening_ports() <= before_ports
