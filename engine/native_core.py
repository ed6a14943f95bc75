"""The native backend: our model, KV pool, block manager, scheduler and runner, stepped by the engine loop.

Building it resolves everything the model's own config decides (context length, dtype, the
KV pool's size in blocks) and refuses impossible settings with one clear message before any
large allocation.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import deque
from pathlib import Path

import psutil
import torch

from engine.attention import make_attention
from engine.block_manager import BlockManager
from engine.config import EngineConfig, flash_attn_available
from engine.cuda_graphs import DecodeGraphs
from engine.errors import ConfigError
from engine.kv_cache import KVCache, bytes_per_block
from engine.loader import load_native_weights
from engine.metrics import StepRecord, peak_memory_bytes, tensor_bytes
from engine.model import LlamaFamilyModel, ModelSpec, rope_cos_sin
from engine.request import Request
from engine.runner import ModelRunner
from engine.scheduler import Scheduler

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_MODEL_LEN = 4096
FLASH_BLOCK_MULTIPLE = 256
CPU_KV_FRACTION_OF_AVAILABLE = 0.25
GPU_KV_FRACTION_OF_FREE = 0.85
STEP_HISTORY = 4096

log = logging.getLogger(__name__)


def resolve_dtype(config: EngineConfig, hf_config, device: str) -> torch.dtype:
    """`auto`: float32 on a CPU (fast and exact there); the checkpoint's half type on a GPU."""
    if config.dtype != "auto":
        return DTYPES[config.dtype]
    if device == "cpu":
        return torch.float32
    stored = getattr(hf_config, "dtype", None)
    stored = DTYPES.get(stored, stored) if isinstance(stored, str) else stored
    return stored if stored in (torch.bfloat16, torch.float16) else torch.bfloat16


def resolve_max_model_len(config: EngineConfig, spec: ModelSpec) -> int:
    limit = spec.max_position_embeddings
    if spec.sliding_window:
        limit = min(limit, spec.sliding_window)
    if config.max_model_len is None:
        return min(limit, DEFAULT_MAX_MODEL_LEN)
    if config.max_model_len > limit:
        raise ConfigError(f"max_model_len={config.max_model_len} exceeds what this model supports ({limit} "
                          "positions, sliding window included)")
    return config.max_model_len


def resolve_attention(config: EngineConfig, device: str, dtype: torch.dtype) -> str:
    """`auto`: flash-attn where it can run (CUDA, half precision, blocks of 256), else sdpa."""
    if config.attention == "auto":
        use_flash = (device == "cuda" and flash_attn_available() and dtype != torch.float32
                     and config.block_size % FLASH_BLOCK_MULTIPLE == 0 and config.kv_layout == "paged")
        return "flash-attn" if use_flash else "sdpa"
    if config.attention == "flash-attn":
        if dtype == torch.float32:
            raise ConfigError("flash-attn computes in float16 or bfloat16; set dtype accordingly")
        if config.block_size % FLASH_BLOCK_MULTIPLE or config.kv_layout != "paged":
            raise ConfigError(f"flash-attn's paged kernels need kv_layout='paged' and block_size a multiple of "
                              f"{FLASH_BLOCK_MULTIPLE}, got {config.kv_layout} / {config.block_size}")
    return config.attention


def resolve_kv_blocks(config: EngineConfig, spec: ModelSpec, block_size: int, max_model_len: int,
                      dtype: torch.dtype, device: str) -> int:
    """How many blocks the pool gets: from `kv_cache_bytes`, or sized to the host when unset."""
    block_bytes = bytes_per_block(spec, block_size, dtype)
    one_sequence = -(-max_model_len // block_size) * block_bytes
    if config.kv_cache_bytes is not None:
        budget = config.kv_cache_bytes
    else:
        wanted = config.max_num_seqs * one_sequence
        if device == "cuda":
            free, _ = torch.cuda.mem_get_info()
            budget = min(wanted, int(free * GPU_KV_FRACTION_OF_FREE))
        else:
            budget = min(wanted, int(psutil.virtual_memory().available * CPU_KV_FRACTION_OF_AVAILABLE))
        budget = max(budget, one_sequence)
    if budget < one_sequence:
        raise ConfigError(f"kv_cache_bytes={budget} cannot hold one sequence of max_model_len={max_model_len} "
                          f"tokens (needs {one_sequence} bytes); raise it or lower max_model_len")
    return budget // block_bytes


class NativeCore:
    """Steps the native engine: schedule, run the model, hand tokens to their requests."""

    def __init__(self, config: EngineConfig, path: Path, hf_config):
        self.device = config.resolved_device
        self.spec = ModelSpec.from_hf_config(hf_config)
        self.vocab_size = self.spec.vocab_size
        self.dtype = resolve_dtype(config, hf_config, self.device)
        self.max_model_len = resolve_max_model_len(config, self.spec)
        self.attention_name = resolve_attention(config, self.device, self.dtype)
        self.block_size = self.max_model_len if config.kv_layout == "contiguous" else config.block_size
        num_blocks = resolve_kv_blocks(config, self.spec, self.block_size, self.max_model_len, self.dtype,
                                       self.device)
        torch.manual_seed(config.seed)
        cos, sin = rope_cos_sin(hf_config, self.max_model_len)
        attention = make_attention(self.attention_name, self.spec.head_dim, self.block_size)
        with torch.device("meta"):
            model = LlamaFamilyModel(self.spec, attention, cos.to(self.device), sin.to(self.device))
        model = model.to_empty(device=self.device).to(self.dtype)
        model.tie_weights()
        load_native_weights(model, path)
        self.model = model.eval()
        use_graphs = config.cuda_graphs and self.device == "cuda" and self.attention_name == "flash-attn"
        self.kv_cache = KVCache(self.spec, num_blocks + int(use_graphs), self.block_size, self.dtype, self.device,
                                head_major=self.attention_name != "flash-attn")
        self.block_manager = BlockManager(num_blocks, self.block_size, config.prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.batching, config.max_num_seqs,
                                   config.max_num_batched_tokens)
        decode_graphs = None
        if use_graphs:
            decode_graphs = DecodeGraphs(self.model, self.kv_cache.layers, config.max_num_seqs,
                                         -(-self.max_model_len // self.block_size), num_blocks, self.block_size,
                                         self.device)
        self.runner = ModelRunner(self.model, self.kv_cache, self.block_manager, self.device, self.attention_name,
                                  decode_graphs)
        self.cuda_graphs = use_graphs
        self.weights_bytes = tensor_bytes(self.model)
        self.history: deque[StepRecord] = deque(maxlen=STEP_HISTORY)
        self.steps = 0

    def add(self, request: Request) -> None:
        self.scheduler.add(request)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def requests(self) -> list[Request]:
        return list(self.scheduler.running) + list(self.scheduler.waiting)

    def remove(self, request: Request) -> None:
        self.scheduler.remove(request)

    def step(self) -> None:
        """One engine step. A model failure fails the step's requests; the others keep going."""
        started = time.perf_counter()
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return
        completing = [item.request for item in scheduled if item.completes_sequence]
        try:
            tokens = self.runner.execute(scheduled)
        except Exception as error:  # e.g. out of memory: report it on these requests, keep serving
            log.error("model step failed:\n%s", traceback.format_exc())
            for item in scheduled:
                self.scheduler.remove(item.request)
                item.request.finish("error", f"{type(error).__name__}: {error}")
            return
        now = time.perf_counter()
        self.scheduler.complete_step(scheduled)
        for request, token in zip(completing, tokens, strict=True):
            request.append_tokens([token], now)
            if request.finished:
                self.scheduler.remove(request)
        self.steps += 1
        self.history.append(StepRecord(
            time=now, duration=now - started, batch_size=len(scheduled),
            num_tokens=sum(item.num_new_tokens for item in scheduled), num_decode_tokens=len(tokens),
            num_running=len(self.scheduler.running),
            kv_blocks_used=self.block_manager.num_blocks - self.block_manager.num_free_blocks))

    def stats(self) -> dict:
        manager = self.block_manager
        used_blocks = manager.num_blocks - manager.num_free_blocks
        return {
            "weights_bytes": self.weights_bytes,
            "kv_cache_bytes": self.kv_cache.nbytes,
            "kv_cache_used_bytes": used_blocks * self.kv_cache.block_bytes,
            "kv_blocks_total": manager.num_blocks,
            "kv_blocks_free": manager.num_free_blocks,
            "kv_block_size": self.block_size,
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "peak_running": self.scheduler.peak_running,
            "num_preemptions": self.scheduler.num_preemptions,
            "prefix_cache_hit_rate": self.scheduler.prefix_cache_hit_rate,
            "spec_acceptance_rate": 0.0,
            "peak_memory_bytes": peak_memory_bytes(self.device),
            "steps": self.steps,
        }

    def close(self) -> None:
        self.model = None
        self.kv_cache = None
        if self.device == "cuda":
            torch.cuda.empty_cache()
