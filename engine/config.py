"""`EngineConfig`: every knob of the engine, validated when a configuration is built.

The field names are a contract (docs/metrics.md lists them): they are also the keys of the preset
TOML files and the labels of the playground's controls. Validation here only needs the config
itself and the host (is CUDA there, is flash-attn importable); checks that need the model's own
config.json (context length, head counts) happen when the configuration is planned (`engine/plan.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from engine.errors import ConfigError
from engine.gguf import GGUF_TYPES
from engine.host import cpu_cores, cuda_available, flash_attn_available, llama_cpp_available, resolve_device
from engine.hub import curated_draft
from engine.quant.levels import LEVELS as QUANT_LEVELS

CHOICES: dict[str, list[str]] = {
    "backend": ["auto", "native", "hf", "llama.cpp", "remote"],
    "device": ["auto", "cpu", "cuda"],
    "dtype": ["auto", "float32", "bfloat16", "float16"],
    "quantization": ["none", *QUANT_LEVELS],
    "gguf_type": list(GGUF_TYPES),
    "attention": ["auto", "cpu-kernel", "sdpa", "eager", "flash-attn"],
    "kv_layout": ["paged", "contiguous"],
    "kv_cache_dtype": ["auto", "float32", "bfloat16", "int8"],
    "batching": ["continuous", "static"],
    "speculative": ["off", "draft", "ngram"],
    "pipeline_schedule": ["overlap", "flush"],
    "disaggregation": ["off", "prefill-decode"],
}

MAX_SPECULATIVE_TOKENS = 16
LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the versions requirements-test.txt pins
GGUF_VERSION = "0.19.0"
KV_CACHE_NOTES = {
    "bfloat16": "half the bytes of float32 per token; the CPU kernel widens it to float32 as it reads",
    "int8": "int8 values and a float32 scale per token and head (68 bytes per 64 values): 3.8x the tokens of "
            "float32 in the same memory; the CPU kernel reads it in place, other paths dequantize what they gather",
}


def worker_processes_reason(count: int, device: str, what: str, why: str) -> str | None:
    """Why `count` worker processes (`what`: "ranks", "stages", ...) cannot each have a device of their own here:
    a GPU each, or on a CPU a core each (`why` says what sharing one would cost)."""
    if resolve_device(device) == "cuda":
        visible = torch.cuda.device_count()
        if count > visible:
            return f"{count} {what} need {count} CUDA devices (one each); {visible} visible"
    elif count > cpu_cores():
        return f"{count} {what} need {count} CPU cores (one each); this machine has {cpu_cores()}, and {why}"
    return None


def tensor_parallel_reason(size, device: str = "auto", num_heads: int | None = None,
                           num_kv_heads: int | None = None, intermediate_size: int | None = None) -> str | None:
    """Why `size` tensor-parallel ranks cannot run here (and, given its shapes, for this model), or None.

    Each rank needs a device of its own: a GPU, or on a CPU at least one core (ranks that share a
    core stall at every all-reduce until the descheduled one runs again). Query heads, the MLP and
    KV heads must split evenly (fewer KV heads than ranks are replicated, as vLLM does): checked
    when the head counts are given, e.g. once the model's config is read.
    """
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return "must be a positive number of worker processes"
    if size == 1:
        return None
    reason = worker_processes_reason(size, device, "ranks", "ranks sharing a core would stall every all-reduce")
    if reason or num_heads is None:
        return reason
    from engine.model.linear import HeadLayout
    from engine.model.parallel import ParallelContext

    shard = ParallelContext(0, size)
    try:  # the layers' own rules, so the message matches what loading would hit
        HeadLayout(num_heads, num_kv_heads or num_heads, 1, shard)
        if intermediate_size is not None:
            shard.split(intermediate_size, "the MLP width")
    except ValueError as error:
        return str(error)
    return None


def unavailable_reason(field_name: str, value, device: str = "auto") -> str | None:
    """Why `field_name=value` cannot be used on this host with this engine, or None if it can.

    The single source of truth for both validation and the UI, which disables such choices and
    shows the reason instead of pretending they work.
    """
    device = resolve_device(device)
    if field_name == "device" and value == "cuda" and not cuda_available():
        return "no CUDA device on this machine"
    if field_name == "backend" and value == "llama.cpp" and not llama_cpp_available():
        return ("the llama.cpp backend needs the llama-cpp-python and gguf packages: "
                f"pip install llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} gguf=={GGUF_VERSION}")
    if field_name == "attention" and value == "cpu-kernel":
        if device != "cpu":
            return "the engine's paged-attention kernel runs on the CPU only"
        from engine.model import cpu_kernels

        if not cpu_kernels.is_built():
            return cpu_kernels.NOT_BUILT
    if field_name == "attention" and value == "flash-attn":
        if device != "cuda":
            return "flash-attn needs a CUDA device"
        if not flash_attn_available():
            return "the flash_attn package is not installed"
    if field_name == "quantization" and value in QUANT_LEVELS:
        level = QUANT_LEVELS[value]
        if device not in level.devices:
            return level.device_reason
        if not level.installed():
            return f"the {level.library} package is not installed"
        if level.engine_kernels:
            from engine.model import cpu_kernels

            if not cpu_kernels.is_built():
                return cpu_kernels.NOT_BUILT
    if field_name == "tensor_parallel_size":
        return tensor_parallel_reason(value, device)
    if field_name == "pipeline_parallel_size" and value != 1:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return "must be a positive number of stages"
        return worker_processes_reason(value, device, "pipeline stages",
                                       "stages sharing a core would take turns instead of overlapping")
    if field_name == "disaggregation" and value == "prefill-decode":
        return worker_processes_reason(2, device, "workers (prefill and decode)",
                                       "a prefill sharing the decode worker's core would stall its decode steps")
    return None


def choice_note(field_name: str, value, device: str = "auto") -> str | None:
    """A note to show beside a usable choice, or None: what it does, and whether it is very slow here.

    The engine still runs such a choice; the note keeps a slow figure from being read as a broken one.
    """
    device = resolve_device(device)
    if field_name == "quantization" and value in QUANT_LEVELS:
        level = QUANT_LEVELS[value]
        return " · ".join(part for part in (f"{level.library}: {level.summary}", level.packs, level.note(device))
                          if part)
    if field_name == "kv_cache_dtype" and value in KV_CACHE_NOTES:
        return KV_CACHE_NOTES[value]
    if field_name == "gqa" and value == "mha":
        return "KV heads repeated to one per query head: same outputs, bigger KV cache, slower decode"
    if field_name == "gqa" and isinstance(value, int):
        return (f"changes the answers: {value} KV head(s) made by mean-pooling the checkpoint's K/V heads of each "
                "group, with no uptraining (on the demo target 4 heads took held-out perplexity from 106 to 222 and "
                "its answers to gibberish); native backend only")
    return None


@dataclass(frozen=True)
class EngineConfig:
    """Every knob of the engine, validated when constructed: a configuration that exists is a valid one.

    Frozen, so it can key a pool of engines and travel between threads without being changed on the way.
    """

    model: str = "demo"
    backend: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    quantization: str = "none"
    gguf_type: str = "f32"
    attention: str = "auto"
    kv_layout: str = "paged"
    block_size: int = 16
    prefix_caching: bool = True
    kv_cache_bytes: int | None = None
    kv_memory_fraction: float | None = None
    kv_cache_dtype: str = "auto"
    batching: str = "continuous"
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    speculative: str = "off"
    draft_model: str | None = None
    num_speculative_tokens: int = 4
    gqa: str | int = "native"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    pipeline_micro_batches: int | None = None
    pipeline_schedule: str = "overlap"
    disaggregation: str = "off"
    seed: int = 0
    cuda_graphs: bool = True
    cpu_kernels: bool = True
    remote_url: str = ""
    remote_model: str = ""
    remote_api_key_env: str = ""

    def __post_init__(self):
        self.validate()

    @classmethod
    def from_dict(cls, values: dict) -> EngineConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s): {', '.join(unknown)}; "
                              f"known fields: {', '.join(sorted(known))}")
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> EngineConfig:
        """This configuration with `changes`, validated (unknown fields refused)."""
        return EngineConfig.from_dict({**self.to_dict(), **changes})

    def validate(self) -> EngineConfig:
        """Raise ConfigError with one clear message for the first bad value or combination (construction calls it;
        a host that changed since, e.g. kernels built meanwhile, is checked again)."""
        for name, choices in CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ConfigError(f"{name}={value!r} is not one of {choices}")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError("model must be a preset name, a local folder or a hub id")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "num_speculative_tokens",
                     "tensor_parallel_size", "pipeline_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.block_size > 1024 or self.block_size & (self.block_size - 1):
            raise ConfigError(f"block_size must be a power of two up to 1024, got {self.block_size}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise ConfigError(f"max_model_len must be an integer >= 2, got {self.max_model_len!r}")
        if self.kv_cache_bytes is not None and (not isinstance(self.kv_cache_bytes, int) or self.kv_cache_bytes <= 0):
            raise ConfigError(f"kv_cache_bytes must be a positive integer (or unset for automatic), got "
                              f"{self.kv_cache_bytes!r}")
        if self.kv_memory_fraction is not None and (isinstance(self.kv_memory_fraction, bool) or not isinstance(
                self.kv_memory_fraction, int | float) or not 0 < self.kv_memory_fraction <= 1):
            raise ConfigError(f"kv_memory_fraction must be a number in (0, 1] (or unset for the device's default), "
                              f"got {self.kv_memory_fraction!r}")
        if not isinstance(self.seed, int) or not -(2**63) <= self.seed < 2**64:
            raise ConfigError(f"seed must be a 64-bit integer, got {self.seed!r}")
        if not (self.gqa in ("native", "mha") or (isinstance(self.gqa, int) and not isinstance(self.gqa, bool)
                                                   and self.gqa >= 1)):
            raise ConfigError(f"gqa must be 'native', 'mha' or a positive number of KV heads, got {self.gqa!r}")
        if self.kv_layout == "contiguous" and self.prefix_caching:
            raise ConfigError("prefix_caching shares KV blocks between requests and needs kv_layout='paged'; "
                              "turn prefix_caching off for the contiguous layout")
        if not isinstance(self.cpu_kernels, bool):
            raise ConfigError(f"cpu_kernels must be true or false, got {self.cpu_kernels!r}")
        if self.attention == "cpu-kernel" and not self.cpu_kernels:
            raise ConfigError("attention='cpu-kernel' is one of the engine's CPU kernels; it needs cpu_kernels=True")
        if self.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"num_speculative_tokens must be at most {MAX_SPECULATIVE_TOKENS}, got "
                              f"{self.num_speculative_tokens}")
        if self.speculative != "off" and self.backend == "hf":
            raise ConfigError(f"speculative={self.speculative!r} runs inside the native engine's batching; the hf "
                              "backend (transformers) verifies one sequence at a time: use backend='native' or 'auto'")
        if self.draft_model is not None and (not isinstance(self.draft_model, str) or not self.draft_model.strip()):
            raise ConfigError("draft_model must be a preset name, a local folder or a hub id (or unset for the "
                              "model's curated draft)")
        if self.speculative == "draft" and not self.draft_model:
            curated_draft(self.model)
        if self.tensor_parallel_size > 1 and self.backend == "hf":
            raise ConfigError("tensor parallelism shards the native engine's model; the hf backend runs one "
                              "process (use backend='native' or 'auto')")
        if self.pipeline_micro_batches is not None and (
                not isinstance(self.pipeline_micro_batches, int) or isinstance(self.pipeline_micro_batches, bool)
                or self.pipeline_micro_batches < 1):
            raise ConfigError(f"pipeline_micro_batches must be a positive integer (or unset: one per stage), got "
                              f"{self.pipeline_micro_batches!r}")
        self._validate_process_layout()
        self._validate_remote()
        if self.tensor_parallel_size > 1 and self.pipeline_parallel_size > 1:
            reason = worker_processes_reason(self.tensor_parallel_size * self.pipeline_parallel_size, self.device,
                                             "processes (stages x ranks)",
                                             "processes sharing a core would stall every collective")
            if reason:
                raise ConfigError(f"pipeline_parallel_size={self.pipeline_parallel_size} x tensor_parallel_size="
                                  f"{self.tensor_parallel_size}: {reason}")
        if self.attention == "flash-attn" and self.kv_cache_dtype == "int8":
            raise ConfigError("kv_cache_dtype='int8': flash-attn reads float16/bfloat16 K/V only; choose sdpa "
                              "attention (which dequantizes the blocks it gathers) or another kv_cache_dtype")
        for name in ("backend", "device", "attention", "quantization", "speculative", "gqa", "tensor_parallel_size",
                     "pipeline_parallel_size", "disaggregation"):
            reason = unavailable_reason(name, getattr(self, name), self.device)
            if reason:
                raise ConfigError(f"{name}={getattr(self, name)!r}: {reason}")
        if self.backend == "hf" and self.gqa != "native":
            raise ConfigError("GQA conversion (gqa) runs in the native engine only; the hf baseline serves the "
                              "checkpoint's own heads")
        if self.backend == "hf" and self.kv_cache_dtype != "auto":
            raise ConfigError(f"kv_cache_dtype={self.kv_cache_dtype!r}: the hf backend keeps transformers' own KV "
                              "cache in the model's dtype; use kv_cache_dtype='auto' or backend='native'")
        if self.backend == "hf" and self.attention in ("flash-attn", "cpu-kernel"):
            raise ConfigError("the hf backend runs transformers' own attention; choose sdpa, eager or auto")
        self._validate_llama_cpp()
        return self

    def _validate_llama_cpp(self) -> None:
        """What the llama.cpp backend runs: a GGUF of `gguf_type`, one sequence at a time, in this process, on the
        CPU; the native engine's knobs that would change what runs are refused rather than ignored."""
        if self.backend != "llama.cpp":
            if self.gguf_type != "f32":
                raise ConfigError(f"gguf_type={self.gguf_type!r} is the llama.cpp backend's weight file; set "
                                  "backend='llama.cpp' (or leave gguf_type='f32')")
            return
        refused = {
            "device": (self.device == "cuda", "this llama.cpp build runs on the CPU"),
            "dtype": (self.dtype not in ("auto", "float32"),
                      "llama.cpp computes in float32; its weights' type is gguf_type"),
            "quantization": (self.quantization != "none",
                             "the native engine's levels are not llama.cpp's; choose gguf_type (q8_0, q4_0)"),
            "kv_cache_dtype": (self.kv_cache_dtype != "auto",
                               "llama.cpp keeps its own KV cache (float32 for gguf_type f32, else float16)"),
            "attention": (self.attention != "auto", "llama.cpp runs its own attention"),
            "speculative": (self.speculative != "off", "speculative decoding runs in the native engine"),
            "gqa": (self.gqa != "native", "GQA conversion runs in the native engine"),
            "tensor_parallel_size": (self.tensor_parallel_size > 1, "llama.cpp runs in this process, one model"),
            "pipeline_parallel_size": (self.pipeline_parallel_size > 1, "llama.cpp runs in this process, one model"),
            "disaggregation": (self.disaggregation != "off", "llama.cpp runs in this process, one model"),
        }
        for name, (is_refused, why) in refused.items():
            if is_refused:
                raise ConfigError(f"{name}={getattr(self, name)!r} with backend='llama.cpp': {why}")

    def _validate_process_layout(self) -> None:
        """Pipeline stages, tensor-parallel ranks and disaggregated workers: which combinations exist."""
        pipelined = self.pipeline_parallel_size > 1
        if pipelined and self.backend == "hf":
            raise ConfigError("pipeline parallelism splits the native engine's model into stages; the hf backend "
                              "runs one process (use backend='native' or 'auto')")
        if self.disaggregation != "off" and self.backend == "hf":
            raise ConfigError("disaggregation runs the native engine's prefill and decode in two workers; the hf "
                              "backend runs one process (use backend='native' or 'auto')")
        if self.disaggregation != "off" and (pipelined or self.tensor_parallel_size > 1):
            raise ConfigError("disaggregation runs one whole model per worker; it does not combine with tensor or "
                              "pipeline parallelism here (set both sizes to 1)")
        if self.disaggregation != "off" and self.batching == "static":
            raise ConfigError("disaggregation batches both workers continuously (a static batch would hold every "
                              "decode for the next prompts' prefill): set batching='continuous'")
        if self.disaggregation != "off" and self.speculative != "off":
            raise ConfigError("disaggregation does not run speculative decoding (the proposer would need the decode "
                              "worker's K/V in the engine's process): set speculative='off'")
        if pipelined and self.speculative != "off":
            raise ConfigError("speculative decoding is not pipelined: its proposals need the previous step's tokens "
                              "before the next step can enter the first stage; set speculative='off' or "
                              "pipeline_parallel_size=1")
        if self.pipeline_micro_batches is not None and not pipelined:
            raise ConfigError("pipeline_micro_batches splits a step between pipeline stages: it needs "
                              "pipeline_parallel_size > 1 (or leave it unset)")

    def _validate_remote(self) -> None:
        """backend='remote': an OpenAI-compatible server serves the model (`engine/remote/`), so this process only
        keeps `model`'s tokenizer and chat template; the local engine's knobs are the server's (the plan names those
        set here as ignored)."""
        for name in ("remote_url", "remote_model", "remote_api_key_env"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name} must be text, got {getattr(self, name)!r}")
        if self.backend != "remote":
            given = [name for name in ("remote_url", "remote_model", "remote_api_key_env") if getattr(self, name)]
            if given:
                raise ConfigError(f"{', '.join(given)} name(s) a served model: set backend='remote' to use them")
            return
        if not self.remote_url.startswith(("http://", "https://")):
            raise ConfigError(f"remote_url must be the server's http(s) base URL (e.g. http://127.0.0.1:8000/v1), "
                              f"got {self.remote_url!r}")
        if not self.remote_model.strip():
            raise ConfigError("remote_model must be the model name the server serves (its /v1/models lists them)")
        if self.remote_api_key_env and not self.remote_api_key_env.replace("_", "").isalnum():
            raise ConfigError("remote_api_key_env must be the name of an environment variable that holds the API key "
                              f"(letters, digits and _), got {self.remote_api_key_env!r}")

    @property
    def resolved_device(self) -> str:
        return resolve_device(self.device)

