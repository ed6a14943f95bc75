"""Figures an engine should report, worked out without the engine: from the checkpoint files, config.json
and the operating system. Tests compare the engine's stats with these rather than with its own formulas.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import torch
from safetensors import safe_open
from transformers import AutoConfig

from engine import EngineInfo


def checkpoint_bytes(folder: str | Path) -> int:
    """Bytes of every tensor stored in a folder's safetensors files (float32 as the tiny models are saved)."""
    total = 0
    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as checkpoint:
            for name in checkpoint.keys():
                tensor = checkpoint.get_tensor(name)
                total += tensor.numel() * tensor.element_size()
    return total


def kv_bytes_per_token(folder: str | Path, element_size: int) -> int:
    """K and V of one token over all layers (2 x layers x KV heads x head_dim x element size), from config.json."""
    config = AutoConfig.from_pretrained(folder)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * element_size


def element_size(dtype_name: str) -> int:
    """Bytes per element of a dtype named as `engine.info.dtype` names it ("float32", "bfloat16", ...)."""
    return torch.empty((), dtype=getattr(torch, dtype_name)).element_size()


def memory_in_use(device: str) -> int:
    """What the process holds now: resident memory on a CPU, allocated CUDA memory on a GPU.

    A peak reported later can be no smaller (up to the OS's lazy accounting of the resident peak).
    """
    if device == "cuda":
        return torch.cuda.memory_allocated()
    return psutil.Process().memory_info().rss


def engine_info(**fields) -> EngineInfo:
    """An `EngineInfo` of a loaded demo-like engine, with `fields` changed: for figure code tested without a model."""
    defaults = dict(model="demo", path="assets/models/demo-chat", architecture="LlamaForCausalLM", backend="native",
                    device="cpu", device_name="CPU", dtype="float32", kv_cache_dtype="float32", attention="cpu-kernel",
                    quantization="none",
                    max_model_len=1024, vocab_size=6144, num_params=8_000_000, num_kv_heads=8,
                    kv_bytes_per_token=16384, cuda_graphs=False, cpu_kernels=True, tensor_parallel_size=1,
                    draft_model=None, draft_num_params=0, load_seconds=1.0, warmup_seconds=0.1, notices=())
    return EngineInfo(**{**defaults, **fields})
