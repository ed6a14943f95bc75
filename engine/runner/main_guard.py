"""Whether the parent's main script lets tensor-parallel workers start: spawn runs that script again in every worker.

Why: the workers are started with multiprocessing's spawn method (the one that is safe with threads and CUDA), which
prepares each worker by running the parent's main script again, as `__mp_main__`. A script that creates its engine
at its top level, outside an `if __name__ == "__main__":` block, creates it again inside every worker, whose own
start of workers multiprocessing then refuses; the worker exits with code 1 and the explanation goes only to its
stderr, so the engine could only say "rank 1 exited (exit code 1)". The engine looks first and names the fix.
"""

from __future__ import annotations

import ast
import sys
import threading
from pathlib import Path


def _is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":` (either way round)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare) or len(node.test.ops) != 1:
        return False
    sides = [node.test.left, *node.test.comparators]
    names = [side.id for side in sides if isinstance(side, ast.Name)]
    constants = [side.value for side in sides if isinstance(side, ast.Constant)]
    return isinstance(node.test.ops[0], ast.Eq) and names == ["__name__"] and constants == ["__main__"]


def unguarded_main_line() -> tuple[str, int] | None:
    """(script, line) when the main thread is running a top-level statement of the main script outside its main guard
    right now (the engine loads on a helper thread while it waits), so spawned workers would run that statement
    again; None otherwise: no script file (`python -c`, a notebook: spawn runs nothing again), the main thread
    inside the guard, or past the script's end."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path:
        return None
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), path)
    except (OSError, SyntaxError, ValueError):
        return None
    line = frame.f_lineno
    statement = next((node for node in tree.body if node.lineno <= line <= (node.end_lineno or node.lineno)), None)
    if statement is None or _is_main_guard(statement):
        return None
    return path, line
