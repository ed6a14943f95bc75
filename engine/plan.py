"""`EnginePlan`: every choice a configuration leaves open, made once from the configuration and the checkpoint.

Why one step: the backends, the memory estimate (`engine/sizing.py`) and the playground's check line
all need the same answers (which backend serves this checkpoint, on which device, in which dtype,
with which attention and kernels, how long a context, how many KV blocks of which size, what shape
the model has after GQA conversion, which draft), and answers computed in one place cannot
disagree. Planning reads configuration files only (the model's and a draft's config.json and
tokenizers): no weights are loaded and nothing large is allocated, so a server can plan a load
before admitting it. Every refusal that needs the checkpoint (a context longer than the model's, heads
that do not split over the tensor-parallel ranks, a draft of another vocabulary) is raised here,
with one clear message, before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from engine.config import EngineConfig, tensor_parallel_reason
from engine.errors import ConfigError, ModelLoadError
from engine.gguf.convert import unconvertible_reason
from engine.gguf.files import gguf_path
from engine.gguf.vocab import describes_tokenizer
from engine.host import flash_attn_available, resolve_device
from engine.hub import curated_draft, load_hf_config, resolve_model_path
from engine.model import cpu_kernels
from engine.model.gqa import convert_spec
from engine.model.linear import LinearBase
from engine.model.parallel import ParallelContext
from engine.model.spec import NATIVE_ARCHITECTURES, ModelSpec, checkpoint_architecture
from engine.quant.checkpoint import check_prequantized, prequantized_method
from engine.quant.levels import QuantLevel
from engine.quant.methods import check_level
from engine.runner.build import kv_block_bytes, meta_model
from engine.runner.kv_cache import bytes_per_block
from engine.speculative.draft import check_draft

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_MODEL_LEN = 4096
CPU_KV_FRACTION_OF_AVAILABLE = 0.25
GPU_KV_FRACTION_OF_FREE = 0.85
FLASH_BLOCK_MULTIPLE = 256
HF_MIN_PAGE_SIZE = 4  # transformers' continuous batching pages hold at least this many tokens
LLAMA_CPP_IGNORED = ("block_size", "kv_layout", "batching", "kv_cache_bytes", "kv_memory_fraction", "cuda_graphs",
                     "cpu_kernels")
LLAMA_CPP_CONTEXT_MULTIPLE = 256  # llama.cpp rounds a context's positions up to a multiple of this
# Knobs of the local engine that a served model (backend='remote') leaves to its server.
REMOTE_SERVER_SIDE = ("device", "dtype", "quantization", "gguf_type", "attention", "kv_layout", "block_size",
                      "prefix_caching", "kv_cache_bytes", "kv_memory_fraction", "kv_cache_dtype", "batching",
                      "max_num_seqs", "max_num_batched_tokens", "speculative", "draft_model", "num_speculative_tokens",
                      "gqa", "tensor_parallel_size", "pipeline_parallel_size", "pipeline_micro_batches",
                      "pipeline_schedule", "disaggregation", "cuda_graphs", "cpu_kernels")


@dataclass(frozen=True)
class DraftPlan:
    """The speculative draft model: which one, where, and its shapes (checked against the target's)."""

    name: str
    path: Path
    hf_config: object
    spec: ModelSpec


@dataclass(frozen=True)
class EnginePlan:
    """What an engine of `config` will be, every `auto` made concrete, before anything is loaded.

    `config` is the configuration with `backend` and `max_model_len` resolved. `spec` (native backend
    only) is the model's shape after GQA conversion. `kv_dtype` is what the KV pools store (`kv_cache_dtype`
    resolved; `torch.int8` is the int8 rows with an inline scale, model/kv_format.py). `kv_block_bytes` counts
    one block over every layer, every tensor-parallel rank and a draft's pool; `num_kv_blocks` is 0 where
    transformers grows its own cache (the hf backend's static batching).
    """

    config: EngineConfig
    path: Path
    hf_config: object
    architecture: str
    device: str
    dtype: torch.dtype
    kv_dtype: torch.dtype
    attention: str
    cpu_kernels: bool
    cuda_graphs: bool
    max_model_len: int
    block_size: int
    num_kv_blocks: int
    kv_block_bytes: int
    kv_bytes_per_token: int
    num_kv_heads: int
    vocab_size: int
    spec: ModelSpec | None = None
    draft: DraftPlan | None = None
    notices: tuple[str, ...] = ()

    @property
    def backend(self) -> str:
        return self.config.backend

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def kv_dtype_name(self) -> str:
        return str(self.kv_dtype).removeprefix("torch.")

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of the KV pools the native engine allocates (0 where transformers sizes its own cache); with
        disaggregation each of the two workers has a pool of `num_kv_blocks` (the budget is per worker); llama.cpp's
        one sequence of `max_model_len` positions."""
        pools = 2 if self.config.disaggregation != "off" else 1
        return pools * self.num_kv_blocks * self.kv_block_bytes if self.backend in ("native", "llama.cpp") else 0

    def summary(self) -> str:
        """One line of what would load, as the playground's check line shows it."""
        if self.backend == "remote":
            return (f"remote · {self.config.remote_url} · model {self.config.remote_model} · prompts encoded with "
                    f"{self.config.model}'s tokenizer · context {self.max_model_len}")
        parts = [self.backend, self.device, self.dtype_name, f"{self.attention} attention",
                 f"context {self.max_model_len}"]
        if self.backend == "native":
            layout = "contiguous" if self.config.kv_layout == "contiguous" else f"blocks of {self.block_size}"
            parts.append(f"{self.num_kv_blocks:,} KV blocks ({layout}, {self.num_kv_heads} KV heads, "
                         f"{self.kv_dtype_name})")
        if self.backend == "llama.cpp":
            parts.append(f"GGUF {self.config.gguf_type}, one sequence at a time ({self.kv_dtype_name} KV)")
        if self.draft:
            parts.append(f"draft {self.draft.name}")
        return " · ".join(parts)


def plan_engine(config: EngineConfig, download: bool = True) -> EnginePlan:
    """Resolve `config` against its checkpoint and this host; raises ConfigError / ModelLoadError. Without
    `download`, a hub model (or draft) that is not in the local cache is refused instead of fetched."""
    config = config.validate()
    path = resolve_model_path(config.model, download)
    hf_config = load_hf_config(path)
    architecture = checkpoint_architecture(hf_config)
    if config.backend == "remote":
        return _plan_remote(config, path, hf_config, architecture)
    not_native = _not_native_reason(architecture, hf_config)
    notices: list[str] = []
    if config.backend == "llama.cpp":
        return _plan_llama_cpp(config, path, hf_config, architecture)
    if config.backend == "native" and not_native:
        raise ModelLoadError(f"{not_native} (it runs full-precision {', '.join(NATIVE_ARCHITECTURES)} "
                             "checkpoints); use backend='hf'")
    if config.tensor_parallel_size > 1 and not_native:
        raise ModelLoadError(f"{not_native}, and tensor parallelism shards the native engine's model")
    if config.backend == "auto" and not_native and config.speculative != "off":
        raise ModelLoadError(f"{not_native}, and speculative decoding runs in the native engine: set "
                             "speculative='off' to serve it through transformers")
    if config.backend == "auto" and not_native and config.kv_cache_dtype != "auto":
        raise ConfigError(f"{not_native}, and kv_cache_dtype={config.kv_cache_dtype!r} is the native engine's KV "
                          "pool (transformers keeps its own cache): set kv_cache_dtype='auto' to serve it")
    if config.backend == "auto":
        config = config.replace(backend="hf" if not_native else "native")
        if not_native:
            notices.append(f"{not_native}: served by transformers")
    device = resolve_device(config.device)
    dtype = resolve_dtype(config, hf_config, device)
    if config.backend == "native":
        return _plan_native(config, path, hf_config, architecture, device, dtype, notices, download)
    return _plan_hf(config, path, hf_config, architecture, device, dtype, notices)


def resolve_dtype(config: EngineConfig, hf_config, device: str) -> torch.dtype:
    """`auto`: float32 on a CPU (fast and exact there); the checkpoint's half type on a GPU."""
    if config.dtype != "auto":
        return DTYPES[config.dtype]
    if device == "cpu":
        return torch.float32
    stored = getattr(hf_config, "dtype", None)
    stored = DTYPES.get(stored, stored) if isinstance(stored, str) else stored
    return stored if stored in (torch.bfloat16, torch.float16) else torch.bfloat16


def resolve_kv_dtype(config: EngineConfig, dtype: torch.dtype) -> torch.dtype:
    """What the KV pools store: `auto` is the model's dtype; `int8` is int8 rows with an inline float32 scale."""
    if config.kv_cache_dtype == "auto":
        return dtype
    return torch.int8 if config.kv_cache_dtype == "int8" else DTYPES[config.kv_cache_dtype]


def hf_attention_implementation(config: EngineConfig) -> str:
    """transformers' name for the attention the config asks for (its continuous batching pages eager itself)."""
    return "eager" if config.attention == "eager" else "sdpa"


def kv_budget_bytes(config: EngineConfig, one_sequence_bytes: int, device: str) -> int:
    """Bytes for the KV pool: `kv_cache_bytes` when set, else a memory budget: `kv_memory_fraction` of the
    memory free at planning (by default a quarter of the available RAM on a CPU, 85% of the free GPU memory),
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


def _not_native_reason(architecture: str, hf_config) -> str | None:
    """Why the native engine cannot serve this checkpoint, or None."""
    if architecture not in NATIVE_ARCHITECTURES:
        return f"architecture {architecture} is not covered by the native engine"
    prequantized = prequantized_method(hf_config)
    if prequantized:
        return f"this checkpoint is pre-quantized ({prequantized}), which the native engine does not load"
    return None


def _plan_native(config: EngineConfig, path: Path, hf_config, architecture: str, device: str, dtype: torch.dtype,
                 notices: list[str], download: bool) -> EnginePlan:
    spec = convert_spec(ModelSpec.from_hf_config(hf_config), config.gqa)
    reason = tensor_parallel_reason(config.tensor_parallel_size, config.device, spec.num_heads, spec.num_kv_heads,
                                    spec.intermediate_size)
    if reason:
        raise ConfigError(f"tensor_parallel_size={config.tensor_parallel_size}: {reason}")
    _check_pipeline(config, spec)
    level = check_level(config.quantization, dtype)
    level_notice = _level_notice(level, config, spec, dtype, device)
    if level_notice:
        notices.append(level_notice)
    draft = _plan_draft(config, path, hf_config, download) if config.speculative == "draft" else None
    max_model_len = _native_max_model_len(config, spec, *([draft.spec] if draft else []))
    kernels, kernels_notice = _cpu_kernels(config, device, dtype)
    if kernels_notice:
        notices.append(kernels_notice)
    if level is not None and level.engine_kernels and not kernels:
        raise ConfigError(f"quantization={config.quantization!r} is computed by the engine's CPU kernels, which this "
                          f"configuration does not run ({kernels_notice or 'cpu_kernels is off'})")
    kv_dtype = resolve_kv_dtype(config, dtype)
    attention = _native_attention(config, device, dtype, kv_dtype, kernels)
    block_size = max_model_len if config.kv_layout == "contiguous" else config.block_size
    size = config.tensor_parallel_size
    block_bytes = kv_block_bytes(spec, block_size, kv_dtype, size)
    if draft:
        block_bytes += bytes_per_block(draft.spec, block_size, kv_dtype)
    one_sequence = -(-max_model_len // block_size) * block_bytes
    budget = kv_budget_bytes(config, one_sequence, device)
    if budget < one_sequence:
        raise ConfigError(f"kv_cache_bytes={budget} cannot hold one sequence of max_model_len={max_model_len} "
                          f"tokens (needs {one_sequence} bytes); raise it or lower max_model_len")
    graphs_off = cuda_graphs_off(config, device, attention)
    graphs = graphs_off is None
    if config.cuda_graphs and device == "cuda" and attention == "flash-attn" and graphs_off:
        notices.append(f"CUDA graphs are {graphs_off}")
    return EnginePlan(
        config=config.replace(max_model_len=max_model_len), path=path, hf_config=hf_config,
        architecture=architecture, device=device, dtype=dtype, kv_dtype=kv_dtype, attention=attention,
        cpu_kernels=kernels, cuda_graphs=graphs, max_model_len=max_model_len, block_size=block_size,
        num_kv_blocks=budget // block_bytes, kv_block_bytes=block_bytes,
        kv_bytes_per_token=kv_block_bytes(spec, 1, kv_dtype, size), num_kv_heads=spec.num_kv_heads,
        vocab_size=spec.vocab_size, spec=spec, draft=draft, notices=tuple(notices))


def cuda_graphs_off(config: EngineConfig, device: str, attention: str) -> str | None:
    """Why the native engine does not capture its decode steps as CUDA graphs with this configuration on `device`
    with `attention` resolved (None: it does). Graphs are captured around the flash-attn decode path only."""
    if device != "cuda":
        return "off: no GPU"
    if not config.cuda_graphs:
        return "off: cuda_graphs=False"
    if attention != "flash-attn":
        why = "" if flash_attn_available() else "; flash-attn is not installed"
        return f"off: captured on the flash-attn decode path only (attention is {attention}{why})"
    if config.pipeline_parallel_size > 1:
        return "off under pipeline parallelism (a stage runs part of the layers)"
    if config.tensor_parallel_size > 1:
        return "off under tensor parallelism (not captured with collectives inside)"
    return None


def _check_pipeline(config: EngineConfig, spec: ModelSpec) -> None:
    """Pipeline stages need a layer each at least, and are not composed with tensor parallelism (yet)."""
    stages = config.pipeline_parallel_size
    if stages > spec.num_layers:
        raise ConfigError(f"pipeline_parallel_size={stages}: this model has {spec.num_layers} decoder layer(s), "
                          "and each stage needs at least one; use at most as many stages as layers")
    if stages > 1 and config.tensor_parallel_size > 1:
        raise ConfigError(f"pipeline_parallel_size={stages} with tensor_parallel_size={config.tensor_parallel_size}: "
                          "stages of tensor-parallel ranks are not built; use one or the other")


def _level_notice(level: QuantLevel | None, config: EngineConfig, spec: ModelSpec, dtype: torch.dtype,
                  device: str) -> str | None:
    """The quantization level's word on this model's layers (e.g. which 2:4-pruned weights stay dense), read from
    rank 0's linear layers on the meta device."""
    if level is None or level.plan_notice is None:
        return None
    model = meta_model(spec, dtype, config.quantization, device, ParallelContext(0, config.tensor_parallel_size))
    layers = {(module.prefix.rsplit(".", 1)[-1], module.output_size, module.input_size)
              for module in model.modules() if isinstance(module, LinearBase)}
    return level.plan_notice(sorted(layers), dtype, device)


def _plan_hf(config: EngineConfig, path: Path, hf_config, architecture: str, device: str, dtype: torch.dtype,
             notices: list[str]) -> EnginePlan:
    prequantized = prequantized_method(hf_config)
    if prequantized:
        check_prequantized(prequantized, device, config.quantization)
    check_level(config.quantization, dtype, backend="hf")
    text = hf_config.get_text_config()
    limit = getattr(text, "max_position_embeddings", None) or DEFAULT_MAX_MODEL_LEN
    max_model_len = min(config.max_model_len or DEFAULT_MAX_MODEL_LEN, limit)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    token_bytes = 2 * text.num_hidden_layers * kv_heads * head_dim * torch.finfo(dtype).bits // 8
    notices += _hf_ignored_knobs(config, device)
    block_size = num_blocks = 0
    if config.batching == "continuous":
        block_size = max(config.block_size, HF_MIN_PAGE_SIZE)
        if block_size != config.block_size:
            notices.append(f"transformers' continuous batching needs pages of at least {HF_MIN_PAGE_SIZE} "
                           f"tokens: using {block_size}")
        notices.append("transformers' continuous batching samples greedily for the whole batch: "
                       "requests with temperature > 0 are served by generate instead")
        one_sequence = -(-max_model_len // block_size) * token_bytes * block_size
        num_blocks = max(1, kv_budget_bytes(config, one_sequence, device) // (token_bytes * block_size))
    return EnginePlan(
        config=config.replace(max_model_len=max_model_len), path=path, hf_config=hf_config,
        architecture=architecture, device=device, dtype=dtype, kv_dtype=dtype,
        attention=f"transformers {hf_attention_implementation(config)}", cpu_kernels=False, cuda_graphs=False,
        max_model_len=max_model_len, block_size=block_size, num_kv_blocks=num_blocks,
        kv_block_bytes=token_bytes * block_size, kv_bytes_per_token=token_bytes, num_kv_heads=kv_heads,
        vocab_size=text.vocab_size, notices=tuple(notices))


def _plan_llama_cpp(config: EngineConfig, path: Path, hf_config, architecture: str) -> EnginePlan:
    """llama.cpp in this process: the checkpoint's GGUF of `gguf_type` on the CPU, float32 compute, one sequence of
    `max_model_len` positions, which llama.cpp rounds up to a multiple of 256 (its KV in float32 for the f32 file,
    llama.cpp's default float16 otherwise)."""
    reason = unconvertible_reason(hf_config)
    if reason:
        raise ModelLoadError(f"{reason}; the llama.cpp backend serves the checkpoints the project converts")
    spec = ModelSpec.from_hf_config(hf_config)
    max_model_len = _native_max_model_len(config, spec)
    kv_dtype = torch.float32 if config.gguf_type == "f32" else torch.float16
    token_bytes = kv_block_bytes(spec, 1, kv_dtype, 1)
    positions = -(-max_model_len // LLAMA_CPP_CONTEXT_MULTIPLE) * LLAMA_CPP_CONTEXT_MULTIPLE
    file = gguf_path(path, config.gguf_type)
    made = "converted by the project" if config.gguf_type == "f32" else "made by llama.cpp's quantizer from the f32 one"
    notices = [
        "llama.cpp (llama-cpp-python) serves one sequence at a time: requests queue first in, first out (no "
        "continuous batching, no paged KV cache)" + ("; a prompt reuses the K/V of the prefix it shares with the "
                                                     "previous request" if config.prefix_caching else ""),
        f"GGUF {config.gguf_type} ({made}): {file}" + ("" if file.is_file() else ", written on first load"),
        f"llama.cpp threads: {torch.get_num_threads()} (torch's thread count)"]
    if not describes_tokenizer(path):
        notices.append("the GGUF carries no tokenizer llama.cpp reproduces exactly: the engine's tokenizer encodes "
                       "every prompt (as always), llama.cpp gets token ids")
    ignored = _set_away_from_default(config, LLAMA_CPP_IGNORED)
    if ignored:
        notices.append(f"the llama.cpp backend ignores {', '.join(ignored)} (one sequence on the CPU, its KV sized "
                       "by max_model_len)")
    return EnginePlan(
        config=config.replace(max_model_len=max_model_len), path=path, hf_config=hf_config,
        architecture=architecture, device="cpu", dtype=torch.float32, kv_dtype=kv_dtype, attention="llama.cpp",
        cpu_kernels=False, cuda_graphs=False, max_model_len=max_model_len, block_size=positions,
        num_kv_blocks=1, kv_block_bytes=token_bytes * positions, kv_bytes_per_token=token_bytes,
        num_kv_heads=spec.num_kv_heads, vocab_size=spec.vocab_size, spec=spec, notices=tuple(notices))


def _plan_remote(config: EngineConfig, path: Path, hf_config, architecture: str) -> EnginePlan:
    """A model served by an OpenAI-compatible server: this process keeps `model`'s tokenizer and chat template (the
    prompts it sends are token ids it encoded, so two engines compared are given the same tokens) and nothing else;
    device, precision, attention and the KV cache are the server's."""
    text = hf_config.get_text_config()
    limit = getattr(text, "max_position_embeddings", None) or DEFAULT_MAX_MODEL_LEN
    max_model_len = min(config.max_model_len or DEFAULT_MAX_MODEL_LEN, limit)
    dtype = resolve_dtype(config, hf_config, "cpu")  # the checkpoint's, for the record: the server's is its own
    notices = [f"served by {config.remote_url} as {config.remote_model!r}: figures are measured at this client, "
               f"prompts are encoded with {config.model}'s tokenizer"]
    ignored = _set_away_from_default(config, REMOTE_SERVER_SIDE)
    if ignored:
        notices.append(f"the server decides {', '.join(ignored)}: set here, ignored")
    return EnginePlan(
        config=config.replace(max_model_len=max_model_len), path=path, hf_config=hf_config, architecture=architecture,
        device="remote", dtype=dtype, kv_dtype=dtype, attention="the server's", cpu_kernels=False, cuda_graphs=False,
        max_model_len=max_model_len, block_size=0,
        num_kv_blocks=0, kv_block_bytes=0, kv_bytes_per_token=0, num_kv_heads=0, vocab_size=text.vocab_size,
        notices=tuple(notices))


def _set_away_from_default(config: EngineConfig, names: tuple[str, ...]) -> list[str]:
    """Which of the fields `names` the configuration sets to something other than their default (what a backend that
    ignores them names in its notices)."""
    defaults = EngineConfig()
    return [name for name in names if getattr(config, name) != getattr(defaults, name)]


def _hf_ignored_knobs(config: EngineConfig, device: str) -> list[str]:
    """The native-only knobs an hf configuration sets, said rather than silently dropped."""
    ignored = []
    if config.kv_layout == "contiguous":
        ignored.append("kv_layout=contiguous (transformers manages its own cache)")
    if config.batching == "static" and config.prefix_caching:
        ignored.append("prefix_caching (generate has no cross-request cache)")
    if config.batching == "static":
        ignored.append("max_num_batched_tokens, block_size and kv_cache_bytes (generate grows its cache per call)")
    if device == "cuda":
        ignored.append("cuda_graphs (native engine only)")
    return ["the hf backend ignores " + "; ".join(ignored)] if ignored else []


def _plan_draft(config: EngineConfig, target_path: Path, target_hf_config, download: bool) -> DraftPlan:
    name = curated_draft(config.model, config.draft_model)
    path = resolve_model_path(name, download)
    hf_config = load_hf_config(path)
    spec = check_draft(name, path, hf_config, target_path, target_hf_config)
    return DraftPlan(name, path, hf_config, spec)


def _native_max_model_len(config: EngineConfig, spec: ModelSpec, *more_specs: ModelSpec) -> int:
    """The context length: as configured, or the default; never past what every model (a draft too) supports."""
    limit = min(min(s.max_position_embeddings, s.sliding_window or s.max_position_embeddings)
                for s in (spec, *more_specs))
    if config.max_model_len is None:
        return min(limit, DEFAULT_MAX_MODEL_LEN)
    if config.max_model_len > limit:
        raise ConfigError(f"max_model_len={config.max_model_len} exceeds what this model supports ({limit} "
                          "positions, sliding window included)")
    return config.max_model_len


def _cpu_kernels(config: EngineConfig, device: str, dtype: torch.dtype) -> tuple[bool, str | None]:
    """Whether the model computes with the engine's CPU kernels, and why not when they were asked for."""
    if not config.cpu_kernels or device != "cpu":
        return False, None
    if dtype != torch.float32:
        return False, f"the engine's CPU kernels compute in float32; {dtype} runs the pure-PyTorch paths"
    reason = cpu_kernels.unavailable_reason()
    return reason is None, reason and f"pure-PyTorch CPU paths: {reason}"


def _native_attention(config: EngineConfig, device: str, dtype: torch.dtype, kv_dtype: torch.dtype,
                      kernels: bool) -> str:
    """`auto`: flash-attn where it can run (CUDA, half precision, a KV cache of the model's dtype, blocks of 256);
    the engine's paged kernel where its CPU kernels run; else sdpa."""
    if config.attention == "auto":
        use_flash = (device == "cuda" and flash_attn_available() and dtype != torch.float32 and kv_dtype == dtype
                     and config.block_size % FLASH_BLOCK_MULTIPLE == 0 and config.kv_layout == "paged")
        if use_flash:
            return "flash-attn"
        return "cpu-kernel" if kernels else "sdpa"
    if config.attention == "cpu-kernel" and not kernels:
        raise ConfigError("attention='cpu-kernel' needs the engine's CPU kernels: a float32 model on the CPU, with "
                          "the kernels built")
    if config.attention == "flash-attn":
        if dtype == torch.float32:
            raise ConfigError("flash-attn computes in float16 or bfloat16; set dtype accordingly")
        if kv_dtype != dtype:
            raise ConfigError(f"kv_cache_dtype={config.kv_cache_dtype!r}: flash-attn reads a KV cache of the "
                              f"model's dtype ({dtype}) only; use kv_cache_dtype='auto' or sdpa attention")
        if config.block_size % FLASH_BLOCK_MULTIPLE or config.kv_layout != "paged":
            raise ConfigError(f"flash-attn's paged kernels need kv_layout='paged' and block_size a multiple of "
                              f"{FLASH_BLOCK_MULTIPLE}, got {config.kv_layout} / {config.block_size}")
    return config.attention
