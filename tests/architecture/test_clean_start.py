"""A clean start: the app and the bench print nothing on stderr that a user cannot act on.

Library chatter is fixed or scoped where it comes from (see engine/library_logs.py), never hidden by a
blanket warning filter: a `warnings.filterwarnings("ignore")` or `simplefilter("ignore")` without a
category anywhere in the project fails here.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.support.paths import PROJECT_ROOT
from tests.support.ui_helpers import free_port

SOURCE_PLACES = ("engine", "playground", "tests", "app.py")
START_TIMEOUT_S = 180


def blanket_warning_filters(source: str, name: str) -> list[str]:
    """Calls that ignore every warning: `filterwarnings("ignore")` / `simplefilter("ignore")` with no category."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if not isinstance(node, ast.Call):
            continue
        function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if function not in ("filterwarnings", "simplefilter") or not node.args:
            continue
        action = node.args[0]
        if not (isinstance(action, ast.Constant) and action.value == "ignore"):
            continue
        category_position = 2 if function == "filterwarnings" else 1
        has_category = len(node.args) > category_position or any(k.arg == "category" for k in node.keywords)
        if not has_category:
            found.append(f"{name} line {node.lineno}")
    return found


def test_no_blanket_warning_filter_anywhere():
    found = []
    for place in SOURCE_PLACES:
        path = PROJECT_ROOT / place
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            found += blanket_warning_filters(file.read_text(encoding="utf-8"), str(file.relative_to(PROJECT_ROOT)))
    assert not found, f"blanket warning filters: {found}"


def test_the_detector_finds_a_blanket_filter_and_passes_a_scoped_one():
    assert blanket_warning_filters('import warnings\nwarnings.filterwarnings("ignore")\n', "x.py") == ["x.py line 2"]
    assert blanket_warning_filters('from warnings import simplefilter\nsimplefilter("ignore")\n', "x.py")
    assert not blanket_warning_filters('import warnings\nwarnings.filterwarnings("ignore", category=FutureWarning)\n'
                                       'warnings.simplefilter("ignore", DeprecationWarning)\n', "x.py")


def _wait_for(url: str, deadline: float) -> None:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.slow
def test_the_app_starts_serves_and_says_nothing_on_stderr(tmp_path):
    """`python app.py` as `make run` starts it, asked one chat completion (the default engine loaded and used)."""
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False"}
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("w") as stderr:
        app = subprocess.Popen([sys.executable, "app.py"], cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL,
                               stderr=stderr)
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_for(f"{base}/v1/models", time.monotonic() + START_TIMEOUT_S)
            body = json.dumps({"model": "demo", "max_tokens": 3,
                               "messages": [{"role": "user", "content": "What does the json module do?"}]}).encode()
            request = urllib.request.Request(f"{base}/v1/chat/completions", body,
                                             {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as response:
                assert json.load(response)["choices"][0]["finish_reason"] in ("length", "stop")
        finally:
            app.terminate()
            app.wait(timeout=30)
    assert stderr_path.read_text() == "", f"the app wrote to stderr:\n{stderr_path.read_text()[:3000]}"


@pytest.mark.slow
def test_the_bench_says_nothing_on_stderr(tmp_path):
    """A first bench run on a fresh machine (the random model built into an empty cache) writes only its report."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    run = subprocess.run([sys.executable, "-m", "engine.bench", "--set", "model=random-llama-20m", "--num-prompts",
                          "2", "--input-len", "8", "--output-len", "4", "--no-roofline"], cwd=PROJECT_ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "output_throughput" in run.stdout
    assert run.stderr == "", f"the bench wrote to stderr:\n{run.stderr[:3000]}"
