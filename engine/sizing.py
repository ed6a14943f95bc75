"""What an engine configuration will cost in memory, known before anything is allocated.

Why: a server that shares one process between many visitors must refuse a load that would not fit
its memory budget before the load allocates (and zero-fills) gigabytes, not evict or crash after.
The native model is built on the meta device (no storage) with the configuration's quantization
and GQA conversion, and each quantized layer says what its library will allocate (packed weights
plus scales); the KV pool is sized by the same rule, and the same converted head count, the native
engine uses. Other architectures and the hf backend are counted from transformers' own model on
the meta device, each linear layer transformers quantizes (all but the LM head) at its level's size;
a pre-quantized checkpoint (GPTQ, AWQ) by its safetensors files, which hold its packed tensors.
A speculative draft model adds its (full-precision) weights, and its KV pool shares the KV budget.
With tensor parallelism each rank's shard is built and counted (replicated norms and KV heads, the
vocabulary padded to an even split), and the KV pool's blocks cover every rank's heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.config import EngineConfig
from engine.hub import load_hf_config, resolve_model_path


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
    from engine.quant.levels import LEVELS

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


def native_meta_model(spec, dtype: torch.dtype, quantization: str, device: str, parallel=None) -> nn.Module:
    """The native model built from `spec` on the meta device (one rank's shard with `parallel`): shapes, no storage."""
    from engine.model.linear import BuildContext
    from engine.model.llama import LlamaForCausalLM
    from engine.model.parallel import SINGLE_PROCESS
    from engine.quant.methods import linear_method_factory

    build = BuildContext(dtype, "meta", parallel or SINGLE_PROCESS,
                         linear_method=linear_method_factory(quantization, device, dtype))
    no_rope = torch.empty(0)
    return LlamaForCausalLM(spec, None, build, no_rope, no_rope)


def native_weights_bytes(spec, dtype: torch.dtype, quantization: str, device: str, parallel=None) -> int:
    """Weights of the native model built from `spec` (one rank's shard with `parallel`), linear layers at
    `quantization`."""
    from engine.quant.storage import planned_weight_bytes

    return planned_weight_bytes(native_meta_model(spec, dtype, quantization, device, parallel))


def estimate_memory(config: EngineConfig) -> MemoryEstimate:
    """Weights and KV bytes of `config` (validated), without loading the weights."""
    from engine.backends.base import resolve_dtype
    from engine.backends.native import resolve_kv_blocks, resolve_max_model_len
    from engine.model.parallel import ParallelContext
    from engine.model.spec import NATIVE_ARCHITECTURES, ModelSpec
    from engine.model.weights import safetensors_files
    from engine.quant.checkpoint import prequantized_method
    from engine.quant.gqa import convert_spec
    from engine.runner.build import kv_block_bytes, rank_kv_spec
    from engine.runner.kv_cache import bytes_per_block

    config = config.validate()
    path = resolve_model_path(config.model)
    hf_config = load_hf_config(path)
    device = config.resolved_device
    dtype = resolve_dtype(config, hf_config, device)
    architecture = (getattr(hf_config, "architectures", None) or [""])[0]
    if prequantized_method(hf_config):
        return MemoryEstimate(sum(file.stat().st_size for file in safetensors_files(path)), config.kv_cache_bytes or 0)
    if config.backend == "hf" or architecture not in NATIVE_ARCHITECTURES:
        weights = hf_weights_bytes(hf_config, dtype, config.quantization, device)
        return MemoryEstimate(weights, config.kv_cache_bytes or 0)
    spec = convert_spec(ModelSpec.from_hf_config(hf_config), config.gqa)
    size = config.tensor_parallel_size
    rank_weights = tuple(native_weights_bytes(spec, dtype, config.quantization, device, ParallelContext(rank, size))
                         for rank in range(size))
    weights = sum(rank_weights)
    draft_specs = []
    if config.speculative == "draft":
        from engine.spec.draft import resolve_draft_name

        draft_specs.append(ModelSpec.from_hf_config(load_hf_config(resolve_model_path(resolve_draft_name(config)))))
        weights += native_weights_bytes(draft_specs[0], dtype, "none", device)
    max_model_len = resolve_max_model_len(config, spec, *draft_specs)
    block_size = max_model_len if config.kv_layout == "contiguous" else config.block_size
    blocks = resolve_kv_blocks(config, spec, block_size, max_model_len, dtype, device, *draft_specs)
    rank_kv = (blocks * bytes_per_block(rank_kv_spec(spec, size), block_size, dtype),) * size
    draft_kv = sum(blocks * bytes_per_block(s, block_size, dtype) for s in draft_specs)
    return MemoryEstimate(weights, sum(rank_kv) + draft_kv, kv_block_bytes(spec, 1, dtype, size), blocks,
                          rank_weights, rank_kv)
