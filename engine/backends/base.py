"""The backend contract and what every backend shares: defaults, dtype and KV budget rules, records.

`Engine` owns requests, threads and history; a backend only turns queued requests into tokens.
Both backends (native, transformers) implement `Backend`, so the engine loop, streaming,
cancellation, metrics and the charts behave the same on either and the engine never reaches
into a backend's internals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import psutil
import torch

from engine.config import EngineConfig
from engine.core.request import Request
from engine.runner.profiler import DecodeProfile

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_MODEL_LEN = 4096
CPU_KV_FRACTION_OF_AVAILABLE = 0.25
GPU_KV_FRACTION_OF_FREE = 0.85


@dataclass(frozen=True)
class StepRecord:
    """What one engine step did, as the live charts and the bench read it (every backend records these)."""

    time: float
    duration: float
    batch_size: int
    num_tokens: int
    num_decode_tokens: int
    num_running: int
    kv_blocks_used: int
    num_output_tokens: int = 0  # tokens handed to requests (with speculation: accepted proposals + one each)
    spec_proposed: int = 0  # speculative tokens verified in this step (counted in num_decode_tokens) and how
    spec_accepted: int = 0  # many were accepted
    propose_duration: float = 0.0  # seconds of `duration` spent proposing (the draft model's forward passes)
    # What the step's attention covered (0 = not recorded: the transformers backend): K/V positions summed over
    # its sequences (cached ones read + new ones written), and (query, key) pairs it scored, causal.
    context_tokens: int = 0
    attention_pairs: int = 0

    @property
    def spec_acceptance_rate(self) -> float | None:
        """Accepted / proposed in this step (None when nothing was proposed)."""
        return self.spec_accepted / self.spec_proposed if self.spec_proposed else None

    @property
    def tokens_per_sequence(self) -> float | None:
        """Output tokens per sequence that got tokens in this step (1 without speculation)."""
        sequences = self.num_decode_tokens - self.spec_proposed
        return self.num_output_tokens / sequences if sequences > 0 and self.num_output_tokens else None


@dataclass(frozen=True)
class BackendInfo:
    """What a loaded backend resolved (`auto` choices made concrete) and counts about its model."""

    backend: str
    attention: str
    dtype: str
    device: str
    num_params: int
    vocab_size: int
    max_model_len: int
    cuda_graphs: bool = False
    cpu_kernels: bool = False
    tensor_parallel_size: int = 1
    notices: tuple[str, ...] = ()
    quantization: str = "none"
    num_kv_heads: int = 0           # KV heads the cache holds per layer (after any GQA conversion)
    kv_bytes_per_token: int = 0     # K and V of one token over all layers
    draft_model: str | None = None
    draft_num_params: int = 0


@dataclass
class BackendStats:
    """Engine-level figures (DESIGN.md: `engine.stats()`), as one backend measures them."""

    weights_bytes: int
    kv_cache_bytes: int
    kv_cache_used_bytes: int
    kv_blocks_total: int
    kv_blocks_free: int
    kv_block_size: int
    num_running: int
    num_waiting: int
    peak_running: int
    num_preemptions: int
    prefix_cache_hit_rate: float
    spec_acceptance_rate: float
    peak_memory_bytes: int
    steps: int
    notes: list[str] = field(default_factory=list)
    # Tensor parallelism (one entry per rank; a single-process engine is one rank). `executor_seconds` is the
    # time spent running model steps, `collective_seconds` rank 0's part of it inside all-reduce / all-gather
    # (waiting for slower ranks included), and `collective_share` their ratio.
    tensor_parallel_size: int = 1
    rank_pids: list[int] = field(default_factory=list)
    rank_weights_bytes: list[int] = field(default_factory=list)
    rank_kv_cache_bytes: list[int] = field(default_factory=list)
    rank_threads: list[int] = field(default_factory=list)
    rank_collective_seconds: list[float] = field(default_factory=list)
    executor_seconds: float = 0.0
    collective_seconds: float = 0.0
    collective_share: float = 0.0
    # Speculative decoding (vLLM's counters): verification steps with proposals, tokens proposed, accepted,
    # accepted per verification step, and how often each proposal position was accepted.
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_mean_accepted_tokens: float = 0.0
    spec_accepted_per_position: list[int] = field(default_factory=list)
    # The draft model's share of weights_bytes and kv_cache_bytes; its blocks are allocated with the target's.
    draft_weights_bytes: int = 0
    draft_kv_cache_bytes: int = 0
    draft_kv_blocks_total: int = 0
    draft_kv_blocks_free: int = 0


class Backend(Protocol):
    """Turns the requests the engine hands it into tokens, one `step` at a time, on the engine's loop thread."""

    info: BackendInfo

    def add(self, request: Request) -> None:
        """Queue a validated request (its prompt fits `info.max_model_len`)."""

    def abort(self, request: Request) -> None:
        """Take a request out wherever it is (cancelled, failed or finished) and free what it holds."""

    def has_work(self) -> bool:
        """Whether any request is queued or running."""

    def requests(self) -> list[Request]:
        """Every request the backend holds, running or queued."""

    def step(self, record: Callable[[StepRecord], None]) -> None:
        """Advance the running requests. Each model step that runs (the baseline's `generate` runs
        many in one call) is passed to `record` before its tokens reach their requests, so a caller
        who has its output can already see the step. Requests that finish are taken out."""

    def score(self, token_ids: list[int]) -> torch.Tensor | None:
        """float64 log-probabilities of token_ids[1:], each given the tokens before it, through this backend's
        own forward pass (the perplexity of the loaded configuration). Called on the loop thread between
        steps; None when it cannot run now (its KV cache is busy), to be asked again after a step."""

    def stats(self) -> BackendStats:
        """Current figures."""

    def decode_profile(self, since: float) -> DecodeProfile | None:
        """The decode steps finished after `since` against their matmul floor, or None if not profiled."""

    def close(self) -> None:
        """Free the model, the KV cache and any thread or process; the backend is unusable after."""


def resolve_dtype(config: EngineConfig, hf_config, device: str) -> torch.dtype:
    """`auto`: float32 on a CPU (fast and exact there); the checkpoint's half type on a GPU."""
    if config.dtype != "auto":
        return DTYPES[config.dtype]
    if device == "cpu":
        return torch.float32
    stored = getattr(hf_config, "dtype", None)
    stored = DTYPES.get(stored, stored) if isinstance(stored, str) else stored
    return stored if stored in (torch.bfloat16, torch.float16) else torch.bfloat16


def token_log_probs(logits: torch.Tensor, targets: list[int]) -> torch.Tensor:
    """log p(target) under each row of `logits` ([len(targets), vocab]), in float64 on the CPU."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    index = torch.tensor(targets, device=logits.device).unsqueeze(1)
    return log_probs.gather(1, index).squeeze(1).double().cpu()


def kv_budget_bytes(config: EngineConfig, one_sequence_bytes: int, device: str) -> int:
    """Bytes for the KV pool: `kv_cache_bytes` when set, else a memory budget: `kv_memory_fraction` of the
    memory free at load (by default a quarter of the available RAM on a CPU, 85% of the free GPU memory),
    capped at `max_num_seqs` full-length sequences, which is all the pool can ever hold at once (never
    less than one sequence). The native pool is not zero-filled: a CPU commits its pages only as blocks
    are first written, so a generous reservation costs address space, not memory, until used."""
    if config.kv_cache_bytes is not None:
        return config.kv_cache_bytes
    wanted = config.max_num_seqs * one_sequence_bytes
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        budget = int(free * (config.kv_memory_fraction or GPU_KV_FRACTION_OF_FREE))
    else:
        budget = int(psutil.virtual_memory().available * (config.kv_memory_fraction or CPU_KV_FRACTION_OF_AVAILABLE))
    return max(min(wanted, budget), one_sequence_bytes)
