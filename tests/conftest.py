"""Shared fixtures: small random models of every architecture the native engine covers, built locally."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.support.tiny_models import TINY_ARCHITECTURES, build_tiny_chat_model, build_tiny_model


@pytest.fixture(scope="session", autouse=True)
def cpu_kernels_built(request) -> None:
    """The engine's C++ CPU kernels, built as `make test` builds them (a no-op when built), so that the
    kernel paths are tested whenever the suite runs; the pure-PyTorch paths are tested with cpu_kernels=False.
    A GPU-only run (`pytest -m gpu`) tests no CPU kernel path and does not build them."""
    if request.config.getoption("markexpr") == "gpu":
        return
    from engine.model import cpu_kernels

    cpu_kernels.build()
    assert cpu_kernels.unavailable_reason() is None


@pytest.fixture(scope="session", autouse=True)
def device_ceilings_cache(tmp_path_factory):
    """The roofline's ceilings cache of this test session: measured once here, not the user's file, unless the
    environment names one (e.g. to take the README's screenshot with the machine's cached ceilings); app
    processes the tests start inherit it."""
    from engine.tools.roofline import CACHE_ENV

    previous = os.environ.get(CACHE_ENV)
    path = Path(previous) if previous else tmp_path_factory.mktemp("ceilings") / "device-ceilings.json"
    os.environ[CACHE_ENV] = str(path)
    yield path
    if previous is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = previous


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, str]:
    """name -> folder of a saved random model (config.json + safetensors, no tokenizer)."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {name: build_tiny_model(name, root / name) for name in TINY_ARCHITECTURES}


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_dirs) -> str:
    return tiny_model_dirs["llama-gqa"]


@pytest.fixture(scope="session")
def tiny_chat_dir(tmp_path_factory) -> str:
    """A random Llama with a tokenizer and a chat template."""
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))
