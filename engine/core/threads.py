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
from contextlib import contextmanager

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
