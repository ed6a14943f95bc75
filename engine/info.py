"""The engine's public records: `EngineInfo` (what a loaded engine is), `EngineStats` (its figures now) and
`StepRecord` (what one step did).

Why typed records: the playground, the bench and the API read these fields by name; a dataclass keeps
the names checked and the shape fixed, so a closed engine answers with the same fields (zeros, and
`closed` set) as a running one, and a reader never guesses with fallbacks.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.pipeline_stats import PipelineStats


@dataclass(frozen=True)
class EngineInfo:
    """A loaded engine: its model and every choice its plan made (`auto` choices concrete), with counts."""

    model: str
    path: str
    architecture: str
    backend: str
    device: str
    device_name: str
    dtype: str
    kv_cache_dtype: str         # what the KV cache stores (`auto` resolved: the model's dtype unless set)
    attention: str
    quantization: str
    max_model_len: int
    vocab_size: int
    num_params: int
    num_kv_heads: int           # KV heads the cache holds per layer (after any GQA conversion)
    kv_bytes_per_token: int     # K and V of one token over all layers (and tensor-parallel ranks)
    cuda_graphs: bool
    cpu_kernels: bool
    tensor_parallel_size: int
    draft_model: str | None
    draft_num_params: int
    load_seconds: float
    warmup_seconds: float       # the part of load_seconds spent warming the loaded level's kernels up
    notices: tuple[str, ...]


@dataclass(frozen=True)
class EngineStats:
    """Engine-level figures (docs/metrics.md), as one backend measures them; all zeros with `closed` set once the
    engine is closed."""

    closed: bool = False
    weights_bytes: int = 0
    kv_cache_bytes: int = 0
    kv_cache_used_bytes: int = 0
    kv_blocks_total: int = 0
    kv_blocks_free: int = 0
    kv_block_size: int = 0
    num_running: int = 0
    num_waiting: int = 0
    peak_running: int = 0
    num_preemptions: int = 0
    prefix_cache_hit_rate: float = 0.0
    spec_acceptance_rate: float = 0.0
    peak_memory_bytes: int = 0
    steps: int = 0
    notes: tuple[str, ...] = ()
    # Tensor parallelism (one entry per rank; a single-process engine is one rank). `executor_seconds` is the
    # time spent running model steps, `collective_seconds` rank 0's part of it inside all-reduce / all-gather
    # (waiting for slower ranks included), and `collective_share` their ratio.
    tensor_parallel_size: int = 1
    rank_pids: tuple[int, ...] = ()
    rank_weights_bytes: tuple[int, ...] = ()
    rank_kv_cache_bytes: tuple[int, ...] = ()
    rank_threads: tuple[int, ...] = ()
    rank_collective_seconds: tuple[float, ...] = ()
    executor_seconds: float = 0.0
    collective_seconds: float = 0.0
    collective_share: float = 0.0
    # Pipeline parallelism (docs/pipeline-parallelism.md): the rank_* tuples above then have one entry per stage, and
    # `pipeline` holds per stage busy and idle time, the measured and textbook bubble, bytes between stages and
    # a recent timeline (None with one stage).
    pipeline_parallel_size: int = 1
    pipeline: PipelineStats | None = None
    # Speculative decoding (vLLM's counters): verification steps with proposals, tokens proposed, accepted,
    # accepted per verification step, and how often each proposal position was accepted.
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_mean_accepted_tokens: float = 0.0
    spec_accepted_per_position: tuple[int, ...] = ()
    # The draft model's share of weights_bytes and kv_cache_bytes; its blocks are allocated with the target's.
    draft_weights_bytes: int = 0
    draft_kv_cache_bytes: int = 0
    draft_kv_blocks_total: int = 0
    draft_kv_blocks_free: int = 0
    # Disaggregation (docs/disaggregation.md): per worker ("prefill worker", "decode worker"), seconds busy (steps and
    # transfers, as the workers time them), utilisation (busy / wall time since the first step), answers processed,
    # prompt chunks (more than one token) and decode rows run, requests held; the KV moved from prefill to decode
    # (count, bytes, blocks, workers' seconds) and per request moved; the decode pool's share of the KV blocks.
    disaggregation: str = "off"
    worker_roles: tuple[str, ...] = ()
    worker_busy_seconds: tuple[float, ...] = ()
    worker_utilisation: tuple[float, ...] = ()
    worker_steps: tuple[int, ...] = ()
    worker_prefill_chunks: tuple[int, ...] = ()
    worker_decode_rows: tuple[int, ...] = ()
    worker_requests: tuple[int, ...] = ()
    kv_transfers: int = 0
    kv_transfer_bytes: int = 0
    kv_transfer_blocks: int = 0
    kv_transfer_seconds: float = 0.0
    kv_transfer_bytes_per_request: float = 0.0
    kv_transfer_seconds_per_request: float = 0.0
    decode_kv_blocks_total: int = 0
    decode_kv_blocks_free: int = 0

    @property
    def kv_blocks_used(self) -> int:
        return self.kv_blocks_total - self.kv_blocks_free


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
    guided_mask_duration: float = 0.0  # seconds of `duration` computing and applying grammar masks (guided decoding)
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
