"""llama.cpp's OpenAI-compatible server (`python -m llama_cpp.server`, a server nobody here wrote) on the demo model's
GGUF, in a second process on a free port of 127.0.0.1, for the tests that chat with, compare and benchmark a model
served elsewhere."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from engine.gguf.files import ensure_gguf
from engine.hub import load_hf_config, resolve_model_path
from tests.support.ui_helpers import free_port, wait_until_serving


@contextmanager
def llama_cpp_server(model: str = "demo", gguf_type: str = "f32", alias: str = "demo",
                     timeout: float = 120.0) -> Iterator[str]:
    """The server on `model`'s GGUF of `gguf_type` (converted by the project, cached beside the model), serving it
    as `alias`; yields its /v1 base URL once /v1/models answers; terminated afterwards. Requests queue (by default
    this server ends the stream in progress when another request arrives)."""
    path = resolve_model_path(model)
    gguf = ensure_gguf(path, load_hf_config(path), gguf_type, threads=1)
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", alias,
                                "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "1024", "--n_threads", "1",
                                "--verbose", "False", "--interrupt_requests", "False"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        listed = json.loads(wait_until_serving(f"{base}/models", process, "llama_cpp.server", timeout))
        assert alias in [model["id"] for model in listed["data"]]
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)
