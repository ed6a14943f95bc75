"""The engine's helper threads, which leave Ctrl-C (SIGINT) and SIGTERM to the main thread.

Why: the kernel hands a signal sent to the process to any one of its threads that does not block it,
while Python runs signal handlers only in the main thread, and only once that thread runs Python code
again. A Ctrl-C that lands on a helper thread therefore leaves a main thread blocked in a system call
(`time.sleep`, a lock) asleep: seen as an interrupted engine process that did not exit. The engine's own
threads block both signals (as do the threads they start), and callers waiting on a request wake up
regularly (`SIGNAL_CHECK_SECONDS`) to run any handler that is due.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

EXIT_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
SIGNAL_CHECK_SECONDS = 0.1


def start_helper_thread(target: Callable[[], object], name: str) -> threading.Thread:
    """Start a daemon thread that never receives SIGINT or SIGTERM."""

    def run() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, EXIT_SIGNALS)
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


@contextmanager
def exit_signals_blocked():
    """Block SIGINT and SIGTERM in this thread for the block, e.g. while a library starts a thread of its own."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, EXIT_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def run_on_passing_thread(target: Callable[[], T], name: str, discard: Callable[[T], object]) -> T:
    """`target()` on a helper thread that ends when it returns; its result, or its exception raised here.

    Why: a thread that runs torch's parallel CPU operators keeps an OpenMP thread pool until it exits, and
    once the process holds more OpenMP threads than CPUs, libgomp stops spinning between parallel regions
    and puts its threads to sleep: every later region pays a wake-up (on two cores, 8 us -> 60-100 us for a
    small operator, measured). Work done once, such as loading a model, done here leaves no pool behind
    beside the engine loop's. The caller waits in short slices, so a Ctrl-C that reaches it runs its
    handler; a result that arrives after the caller gave up is handed to `discard`.
    """
    outcome: Future = Future()

    def run() -> None:
        try:
            outcome.set_result(target())
        except BaseException as error:
            outcome.set_exception(error)

    def discard_late_result(done: Future) -> None:
        if done.exception() is None:
            discard(done.result())

    thread = start_helper_thread(run, name)
    try:
        while not wait([outcome], timeout=SIGNAL_CHECK_SECONDS).done:
            pass
    except BaseException:  # interrupted while waiting (Ctrl-C): whatever target returns is released
        outcome.add_done_callback(discard_late_result)
        raise
    thread.join()
    return outcome.result()
