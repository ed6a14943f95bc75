"""What an engine configuration will cost in memory, known before anything is allocated.

Why: a server that shares one process between many visitors must refuse a load that would not fit
its memory budget before the load allocates (and zero-fills) gigabytes, not evict or crash after.
Weights are counted by building the model on the meta device (no storage), so every architecture
transformers knows is covered; the KV pool is sized by the same rule the native engine uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.hub import load_hf_config, resolve_model_path


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes an engine will hold once loaded: its weights and its KV pool."""

    weights_bytes: int
    kv_cache_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes


def count_parameters(hf_config) -> int:
    """Parameters of the checkpoint's model, counted on the meta device (tied weights once)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, trust_remote_code=False)
    return sum(p.numel() for p in model.parameters())


def estimate_memory(config: EngineConfig) -> MemoryEstimate:
    """Weights and KV bytes of `config` (validated), without loading the weights."""
    from engine.backends.base import resolve_dtype
    from engine.backends.native import resolve_kv_blocks, resolve_max_model_len
    from engine.model.spec import NATIVE_ARCHITECTURES, ModelSpec
    from engine.runner.kv_cache import bytes_per_block

    config = config.validate()
    hf_config = load_hf_config(resolve_model_path(config.model))
    device = config.resolved_device
    dtype = resolve_dtype(config, hf_config, device)
    element = torch.empty((), dtype=dtype).element_size()
    weights = count_parameters(hf_config) * element
    architecture = (getattr(hf_config, "architectures", None) or [""])[0]
    if config.backend == "hf" or architecture not in NATIVE_ARCHITECTURES:
        return MemoryEstimate(weights, config.kv_cache_bytes or 0)
    spec = ModelSpec.from_hf_config(hf_config)
    max_model_len = resolve_max_model_len(config, spec)
    block_size = max_model_len if config.kv_layout == "contiguous" else config.block_size
    blocks = resolve_kv_blocks(config, spec, block_size, max_model_len, dtype, device)
    return MemoryEstimate(weights, blocks * bytes_per_block(spec, block_size, dtype))
