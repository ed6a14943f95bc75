"""A stand-in for the `spaces` package's ZeroGPU mechanism, so the playground's ZeroGPU mode is tested on a CPU.

Why not the real package: off a ZeroGPU Space, `spaces.GPU(fn)` returns `fn` itself, which proves nothing about a
call that runs elsewhere. This one does what ZeroGPU does to a decorated call: it computes the call's duration (a
number, or a callable given the call's own arguments), forks a worker (`multiprocessing.get_context("fork")`),
pickles `(args, kwargs)` into a queue, runs the function there, and pickles its result (or each yield of a generator
function, or its exception) back. It appends one JSON line per call (`name`, the name of its first argument if it
has one, `duration`, `pid`) to the file named
by FAKE_SPACES_RECORD. On import it makes CUDA's initialisation and an engine's construction fail outside a call,
and records each such attempt as a `violation` line, so a test fails even where the app shows the error instead of
raising it. Put its folder first on PYTHONPATH (or on sys.path) to use it.
"""

from __future__ import annotations

import inspect
import json
import multiprocessing
import os
import pickle
import queue
import traceback

RECORD_ENV = "FAKE_SPACES_RECORD"
POLL_S = 0.5
inside_call = False  # true in a call's worker


def _record(entry: dict) -> None:
    path = os.environ.get(RECORD_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(entry) + "\n")


def _outside_guard(what: str, original):
    """`original`, failing loudly (and recorded) unless it is called inside a GPU call."""

    def guarded(*args, **kwargs):
        if not inside_call:
            _record({"violation": what, "pid": os.getpid(), "stack": traceback.format_stack(limit=12)})
            raise RuntimeError(f"{what} outside a spaces.GPU call")
        return original(*args, **kwargs)

    return guarded


def _install_guards() -> None:
    import torch

    from engine.engine import Engine

    torch.cuda._lazy_init = _outside_guard("CUDA initialised", torch.cuda._lazy_init)
    Engine.__init__ = _outside_guard("an engine built", Engine.__init__)


def _worker(task, inbox, outbox) -> None:
    global inside_call
    inside_call = True
    try:
        args, kwargs = pickle.loads(inbox.get())
        if inspect.isgeneratorfunction(task):
            for item in task(*args, **kwargs):
                outbox.put(("yield", pickle.dumps(item)))
            outbox.put(("done", pickle.dumps(None)))
        else:
            outbox.put(("done", pickle.dumps(task(*args, **kwargs))))
    except BaseException as error:  # sent back like ZeroGPU does, pickled if it can be
        try:
            payload = pickle.dumps(error)
        except Exception:
            payload = pickle.dumps(RuntimeError(f"{type(error).__name__}: {error}"))
        outbox.put(("error", payload))


def _run(task, seconds: float, args, kwargs):
    """Yield ("yield" | "done", value) from one forked call; raise what it raised."""
    first = getattr(args[0], "__name__", None) if args else None  # e.g. the job a generic call runs
    _record({"name": task.__name__, "first_argument": first, "duration": seconds, "pid": os.getpid()})
    context = multiprocessing.get_context("fork")
    inbox, outbox = context.Queue(), context.Queue()
    inbox.put(pickle.dumps((args, kwargs)))
    worker = context.Process(target=_worker, args=(task, inbox, outbox), daemon=True)
    worker.start()
    try:
        while True:
            alive = worker.is_alive()  # read before the queue: a worker that ended has flushed what it sent
            try:
                kind, payload = outbox.get(timeout=POLL_S)
            except queue.Empty:
                if not alive:
                    raise RuntimeError(f"{task.__name__}: the GPU worker died (exit code {worker.exitcode})") from None
                continue
            value = pickle.loads(payload)
            if kind == "error":
                raise value
            yield kind, value
            if kind == "done":
                return
    finally:
        if worker.is_alive():  # the caller stopped early (a closed stream): the call ends
            worker.terminate()
        worker.join(timeout=10)


def GPU(task=None, *, duration=60, **_kwargs):  # noqa: N802 - the real package's name
    """`spaces.GPU`, forking and pickling as ZeroGPU does (see the module's docstring)."""
    if task is None:
        return lambda function: GPU(function, duration=duration)

    def seconds_of(args, kwargs) -> float:
        return float(duration(*args, **kwargs) if callable(duration) else duration)

    if inspect.isgeneratorfunction(task):
        def gpu_generator(*args, **kwargs):
            for kind, value in _run(task, seconds_of(args, kwargs), args, kwargs):
                if kind == "yield":
                    yield value
        return gpu_generator

    def gpu_function(*args, **kwargs):
        for kind, value in _run(task, seconds_of(args, kwargs), args, kwargs):
            if kind == "done":
                return value
        raise RuntimeError("the call ended without a result")
    return gpu_function


_install_guards()
