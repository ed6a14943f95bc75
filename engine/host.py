"""What this machine offers the engine: a CUDA device, flash-attn, how many cores this process may use.

Why a module: the configuration's validation, the plan and the UI's disabled choices all ask the same
questions of the host, and must get the same answers.
"""

from __future__ import annotations

import importlib.util
import os

import torch


def cuda_available() -> bool:
    return torch.cuda.is_available()


def flash_attn_available() -> bool:
    return cuda_available() and importlib.util.find_spec("flash_attn") is not None


def llama_cpp_available() -> bool:
    """Whether the llama.cpp backend's packages (llama-cpp-python, gguf) are installed; nothing is imported."""
    return all(importlib.util.find_spec(name) is not None for name in ("llama_cpp", "gguf"))


def resolve_device(device: str) -> str:
    """`auto` means the GPU when there is one."""
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    return device


def cpu_cores() -> int:
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
