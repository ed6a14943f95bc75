"""Building one process's model runner (model shard, KV pool, CUDA graphs) from plain settings.

Why one builder: with tensor parallelism each worker process builds its own shard of the model
and its own KV pool from the settings the engine resolved, and a single-process engine builds
the same thing with a one-rank `ParallelContext`; the two differ in nothing else. The settings
are plain picklable data so they can be sent to a spawned worker as they are.

Shard arithmetic lives here too, so the plan (which never holds a shard when N > 1), the
memory estimate and the workers agree on it: each rank's KV pool holds its own KV heads (one
replicated head when there are fewer KV heads than ranks).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.model import cpu_kernels
from engine.model.attention import make_attention
from engine.model.linear import BuildContext, HeadLayout
from engine.model.llama import LlamaForCausalLM
from engine.model.parallel import SINGLE_PROCESS, ParallelContext
from engine.model.rotary import rope_cos_sin
from engine.model.spec import ModelSpec
from engine.model.weights import load_weights
from engine.quant.methods import linear_method_factory, lm_head_method_factory
from engine.runner.cuda_graphs import DecodeGraphs
from engine.runner.kv_cache import KVCache, bytes_per_block
from engine.runner.model_runner import ModelRunner


@dataclass(frozen=True)
class RunnerSettings:
    """What the engine resolved about the model and its KV pool: everything a process needs to build its runner.

    `spec` has the head counts the model is built with (after any GQA conversion, which its QKV
    layers apply to the checkpoint's K and V tensors as they load).
    """

    path: str
    hf_config: object
    spec: ModelSpec
    quantization: str
    dtype: torch.dtype
    kv_dtype: torch.dtype
    device: str
    attention: str
    block_size: int
    num_blocks: int
    max_model_len: int
    cuda_graphs: bool
    max_num_seqs: int
    cpu_kernels: bool = False


def rank_kv_spec(spec: ModelSpec, size: int) -> ModelSpec:
    """The spec one rank's KV pool is built from: its own share of the KV heads."""
    heads = HeadLayout(spec.num_heads, spec.num_kv_heads, spec.head_dim, ParallelContext(0, size))
    return spec.replace(num_kv_heads=heads.local_kv_heads)


def kv_block_bytes(spec: ModelSpec, block_size: int, kv_dtype: torch.dtype, size: int) -> int:
    """Bytes one KV block takes over all `size` ranks together (replicated KV heads counted on each rank)."""
    return size * bytes_per_block(rank_kv_spec(spec, size), block_size, kv_dtype)


def build_native_model(spec: ModelSpec, hf_config, path: Path, build: BuildContext, attention,
                       max_model_len: int) -> LlamaForCausalLM:
    """The native model (this rank's shard of it) with its checkpoint loaded, in eval mode."""
    cos, sin = rope_cos_sin(hf_config, max_model_len)
    model = LlamaForCausalLM(spec, attention, build, cos, sin)
    load_weights(model, path)
    return model.eval()


def meta_model(spec: ModelSpec, dtype: torch.dtype, quantization: str, device: str,
               parallel: ParallelContext = SINGLE_PROCESS) -> LlamaForCausalLM:
    """The native model of `spec` (one rank's shard with `parallel`) on the meta device: shapes and the storage its
    quantization level plans (`device` says for which device), no memory."""
    build = BuildContext(dtype, "meta", parallel, linear_method=linear_method_factory(quantization, device, dtype),
                         lm_head_method=lm_head_method_factory(quantization))
    no_rope = torch.empty(0)
    return LlamaForCausalLM(spec, None, build, no_rope, no_rope)


def build_runner(settings: RunnerSettings, parallel: ParallelContext = SINGLE_PROCESS) -> ModelRunner:
    """This process's model shard, KV pool (its KV heads) and decode graphs, ready to execute plans."""
    spec = settings.spec
    if settings.cpu_kernels:  # a worker process loads the library the engine's process found
        reason = cpu_kernels.unavailable_reason()
        if reason:
            raise RuntimeError(f"the engine's CPU kernels cannot load in this process: {reason}")
    attention = make_attention(settings.attention, spec.head_dim, settings.block_size)
    build = BuildContext(settings.dtype, settings.device, parallel,
                         linear_method=linear_method_factory(settings.quantization, settings.device, settings.dtype),
                         lm_head_method=lm_head_method_factory(settings.quantization),
                         cpu_kernels=settings.cpu_kernels)
    model = build_native_model(spec, settings.hf_config, Path(settings.path), build, attention,
                               settings.max_model_len)
    kv_cache = KVCache(rank_kv_spec(spec, parallel.size), settings.num_blocks + int(settings.cuda_graphs),
                       settings.block_size, settings.kv_dtype, settings.device,
                       head_major=settings.attention != "flash-attn")
    decode_graphs = None
    if settings.cuda_graphs:
        decode_graphs = DecodeGraphs(model, kv_cache.layers, settings.max_num_seqs,
                                     -(-settings.max_model_len // settings.block_size), settings.num_blocks,
                                     settings.block_size, settings.device)
    return ModelRunner(model, kv_cache, settings.device, attention, settings.max_model_len, decode_graphs)
