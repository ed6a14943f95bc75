"""What an engine configuration will cost in memory, known before anything is allocated.

Why: a server that shares one process between many visitors must refuse a load that would not fit
its memory budget before the load allocates (and zero-fills) gigabytes, not evict or crash after.
Weights are counted by building the model on the meta device (no storage): transformers' model for
the hf backend (so every architecture it knows is covered), each rank's shard of the native model
otherwise; the KV pool is sized by the same rule the native engine uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.hub import load_hf_config, resolve_model_path


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes an engine will hold once loaded: its weights and its KV pool (over all tensor-parallel ranks),
    and each rank's share of them (one entry per rank; empty for the hf backend)."""

    weights_bytes: int
    kv_cache_bytes: int
    rank_weights_bytes: tuple[int, ...] = ()
    rank_kv_cache_bytes: tuple[int, ...] = ()

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
    from engine.model.parallel import ParallelContext
    from engine.model.spec import NATIVE_ARCHITECTURES, ModelSpec
    from engine.runner.build import rank_kv_spec, shard_weight_bytes
    from engine.runner.kv_cache import bytes_per_block

    config = config.validate()
    hf_config = load_hf_config(resolve_model_path(config.model))
    device = config.resolved_device
    dtype = resolve_dtype(config, hf_config, device)
    architecture = (getattr(hf_config, "architectures", None) or [""])[0]
    if config.backend == "hf" or architecture not in NATIVE_ARCHITECTURES:
        element = torch.empty((), dtype=dtype).element_size()
        return MemoryEstimate(count_parameters(hf_config) * element, config.kv_cache_bytes or 0)
    spec = ModelSpec.from_hf_config(hf_config)
    size = config.tensor_parallel_size
    max_model_len = resolve_max_model_len(config, spec)
    block_size = max_model_len if config.kv_layout == "contiguous" else config.block_size
    blocks = resolve_kv_blocks(config, spec, block_size, max_model_len, dtype, device)
    rank_weights = tuple(shard_weight_bytes(spec, hf_config, dtype, ParallelContext(rank, size))
                         for rank in range(size))
    rank_kv = (blocks * bytes_per_block(rank_kv_spec(spec, size), block_size, dtype),) * size
    return MemoryEstimate(sum(rank_weights), sum(rank_kv), rank_weights, rank_kv)
