"""What an engine configuration will cost in memory, known before anything is allocated.

Why: a server that shares one process between many visitors must refuse a load that would not fit
its memory budget before the load allocates (and zero-fills) gigabytes, not evict or crash after.
Everything is counted from the configuration's plan (`engine/plan.py`), the one the engine would
load with: the native model is built on the meta device (no storage) in the plan's shapes (after
GQA conversion) at its quantization, each quantized layer saying what its library will allocate
(packed weights plus scales), and the KV pool has the plan's blocks. Other architectures and the hf
backend are counted from transformers' own model on the meta device, each linear layer transformers
quantizes (all but the LM head) at its level's size; a pre-quantized checkpoint (GPTQ, AWQ) by its
safetensors files, which hold its packed tensors.
A speculative draft model adds its (full-precision) weights, and its KV pool shares the KV budget.
With tensor parallelism each rank's shard is built and counted (replicated norms and KV heads, the
vocabulary padded to an even split), and the KV pool's blocks cover every rank's heads. The llama.cpp
backend holds its GGUF file (memory-mapped) and one sequence's KV of `max_model_len` positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.config import EngineConfig
from engine.gguf.files import gguf_path
from engine.model.parallel import ParallelContext
from engine.model.weights import safetensors_files
from engine.plan import EnginePlan, plan_engine
from engine.quant.checkpoint import prequantized_method
from engine.quant.levels import LEVELS
from engine.quant.storage import planned_weight_bytes
from engine.runner.build import meta_model, rank_kv_spec
from engine.runner.kv_cache import bytes_per_block

GGUF_BYTES_PER_WEIGHT = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}  # blocks of 32: a scale + values


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes an engine will hold once loaded: its weights and its KV pool (over all tensor-parallel ranks),
    what one token of KV costs, and each rank's share (one entry per rank; empty for the hf backend)."""

    weights_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int = 0
    kv_blocks: int = 0
    rank_weights_bytes: tuple[int, ...] = ()
    rank_kv_cache_bytes: tuple[int, ...] = ()

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes


def _meta_hf_model(hf_config) -> nn.Module:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config, trust_remote_code=False)


def hf_weights_bytes(hf_config, dtype: torch.dtype, quantization: str, device: str) -> int:
    """Weights of the transformers model at `dtype`, its linear layers but the LM head at `quantization`."""
    model = _meta_hf_model(hf_config)
    element = torch.empty((), dtype=dtype).element_size()
    level = LEVELS.get(quantization)
    output_layer = model.get_output_embeddings()
    total = 0
    quantized: set[int] = set()
    if level is not None:
        for module in model.modules():
            if isinstance(module, nn.Linear) and module is not output_layer:
                total += level.storage_bytes(module.out_features, module.in_features, dtype, device)
                quantized.add(id(module.weight))
    rest = sum(p.numel() * element for p in model.parameters() if id(p) not in quantized)
    return total + rest + sum(b.numel() * b.element_size() for b in model.buffers())  # RoPE frequencies


def gguf_weights_bytes(plan: EnginePlan) -> int:
    """The llama.cpp backend's weights: its GGUF file's size once it exists, else its tensors at the type's bytes per
    weight (matrices; llama.cpp keeps the norms in float32; the file's metadata, a few hundred KB, not counted)."""
    file = gguf_path(plan.path, plan.config.gguf_type)
    if file.is_file():
        return file.stat().st_size
    per_weight = GGUF_BYTES_PER_WEIGHT[plan.config.gguf_type]
    model = meta_model(plan.spec, torch.float32, "none", plan.device)
    return int(sum(p.numel() * (per_weight if p.dim() == 2 else 4) for p in model.parameters()))


def estimate_memory(config: EngineConfig | EnginePlan) -> MemoryEstimate:
    """Weights and KV bytes of a configuration (or of its plan), without loading the weights."""
    plan = config if isinstance(config, EnginePlan) else plan_engine(config)
    config = plan.config
    if plan.backend == "llama.cpp":
        return MemoryEstimate(gguf_weights_bytes(plan), plan.kv_cache_bytes, plan.kv_bytes_per_token, 1)
    if plan.backend == "remote":  # the server holds the model; this process only a tokenizer
        return MemoryEstimate(0, 0)
    if prequantized_method(plan.hf_config):
        return MemoryEstimate(sum(file.stat().st_size for file in safetensors_files(plan.path)), 0)
    if plan.backend == "hf":
        weights = hf_weights_bytes(plan.hf_config, plan.dtype, config.quantization, plan.device)
        return MemoryEstimate(weights, config.kv_cache_bytes or 0)
    size = config.tensor_parallel_size
    rank_weights = tuple(planned_weight_bytes(meta_model(plan.spec, plan.dtype, config.quantization, plan.device,
                                                         ParallelContext(rank, size)))
                         for rank in range(size))
    weights = sum(rank_weights)
    draft_kv = 0
    if plan.draft:
        weights += planned_weight_bytes(meta_model(plan.draft.spec, plan.dtype, "none", plan.device))
        draft_kv = plan.num_kv_blocks * bytes_per_block(plan.draft.spec, plan.block_size, plan.kv_dtype)
    rank_kv = (plan.num_kv_blocks * bytes_per_block(rank_kv_spec(plan.spec, size), plan.block_size,
                                                  plan.kv_dtype),) * size
    if config.disaggregation != "off":  # two workers, each a whole model with a pool of its own
        rank_weights, rank_kv = rank_weights * 2, rank_kv * 2
        weights = sum(rank_weights)
    return MemoryEstimate(weights, sum(rank_kv) + draft_kv, plan.kv_bytes_per_token, plan.num_kv_blocks,
                          rank_weights, rank_kv)
