"""Starting the real playground (real engine pool) in-process on a free port, for the UI, API and browser tests.

The model is the bundled demo model when it is there, else a tiny random Llama with a tokenizer and
a chat template built in a temporary folder (so the chat path is the real one either way).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

from engine import list_models
from tests.support.paths import PROJECT_ROOT
from tests.support.tiny_models import build_tiny_chat_model

ROOT = PROJECT_ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pick_model(tmp_path_factory) -> str:
    """The bundled demo model when present, else a tiny random one."""
    entry = list_models().get("demo")
    if entry is not None and (ROOT / entry.source / "config.json").is_file():
        return "demo"
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))


def start_app(model: str, settings, models: dict | None = None):
    """The real app on a free port of 127.0.0.1; returns (playground, demo, url)."""
    from playground.app import build_app, create_playground, launch

    app = create_playground(settings, default_model=model, models=models)
    demo = build_app(app)
    port = free_port()
    launch(app, demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    return app, demo, f"http://127.0.0.1:{port}/"


@contextmanager
def serving(tmp_path_factory, settings) -> Iterator[SimpleNamespace]:
    """The real app on the picked model with `settings`, as (app, demo, url, model); closed afterwards."""
    model = pick_model(tmp_path_factory)
    app, demo, url = start_app(model, settings)
    try:
        yield SimpleNamespace(app=app, demo=demo, url=url, model=model)
    finally:
        demo.close()
        app.pool.close()


def api_client(url: str):
    """A gradio_client for the app at `url` (one client is one session)."""
    from gradio_client import Client

    return Client(url, verbose=False)


def wait_until_serving(url: str, process, what: str, timeout: float) -> bytes:
    """The body of `url` once the server `process` (a Popen) answers it; fails if it exits or `timeout` passes."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.read()
        except OSError:
            assert process.poll() is None, f"{what} exited"
            assert time.monotonic() < deadline, f"{what} did not serve in time"
            time.sleep(0.3)


@contextmanager
def app_process(env: dict | None = None, timeout: float = 120.0) -> Iterator[str]:
    """`python app.py` in a second process on a free port of 127.0.0.1, as its base URL once it serves the page;
    terminated afterwards."""
    import os
    import subprocess
    import sys

    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})}
    process = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(f"{url}/", process, "app.py", timeout)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
