"""Take a configuration to a cluster: the `vllm serve` or SGLang launch command equivalent to an `EngineConfig`.

    python -m engine.bench --export vllm|sglang [--preset P] [--set k=v ...] [--model M]

Flags change between releases, so each target names the version its flags were checked against
(`TARGETS`; docs/export.md says where). Every `EngineConfig` field gets a row: the flag it became, or
why the target does that by default, or why it has no equivalent (`unmapped`, with the closest flag
named only as a suggestion, never put in the command). Nothing here runs anything: it builds strings.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from engine.config import EngineConfig
from engine.errors import ConfigError
from engine.hub import PROJECT_ROOT, curated_draft, list_models
from engine.speculative.ngram import NGRAM_MAX, NGRAM_MIN


@dataclass(frozen=True)
class Target:
    """A serving engine and the release whose flags the export writes."""

    name: str
    label: str
    version: str
    docs: str


TARGETS: dict[str, Target] = {
    "vllm": Target("vllm", "vLLM", "0.11.0", "https://docs.vllm.ai/en/v0.11.0/"),
    "sglang": Target("sglang", "SGLang", "0.5.4", "https://docs.sglang.ai/"),
}


@dataclass(frozen=True)
class Row:
    """One `EngineConfig` field: the flag it became (None: none), what it means there, and whether it has no
    equivalent (`unmapped`: `note` says why, and names the closest flag as a suggestion where there is one)."""

    field: str
    value: object
    flag: str | None
    note: str
    unmapped: bool = False


@dataclass(frozen=True)
class ExportCommand:
    """One server to start: its role ("server", or "prefill"/"decode" when disaggregated) and its argv."""

    role: str
    argv: tuple[str, ...]

    @property
    def shell(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class ExportResult:
    """The command(s) for `target`, a row per `EngineConfig` field, and extra notes (e.g. a router to start)."""

    target: Target
    commands: tuple[ExportCommand, ...]
    rows: tuple[Row, ...]
    notes: tuple[str, ...] = ()

    @property
    def argv(self) -> list[str]:
        """The first (usually only) command's tokens."""
        return list(self.commands[0].argv)

    @property
    def shell(self) -> str:
        """Every command, shell-quoted, one a line."""
        return "\n".join(command.shell for command in self.commands)

    @property
    def unmapped(self) -> list[Row]:
        return [row for row in self.rows if row.unmapped]

    def row(self, field: str) -> Row:
        return next(row for row in self.rows if row.field == field)


def resolve_model(model: str) -> tuple[str, str | None]:
    """What the server should load for `model` (a curated name, a local folder or a hub id), and a note when it
    is a local folder (the server must be able to read that path)."""
    entry = list_models().get(model)
    source = entry.source if entry else model
    local = Path(source) if Path(source).is_absolute() else PROJECT_ROOT / source
    if local.is_dir():
        return str(local), (f"{model!r} is a local folder ({local}): copy it to the server's machine and pass the "
                            "path it has there")
    if Path(source).expanduser().is_dir():
        path = str(Path(source).expanduser().resolve())
        return path, f"{model!r} is a local folder: copy it to the server's machine and pass the path it has there"
    return source, None


_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
# Weight formats each target computes from a full-precision checkpoint as it loads (flag tokens), and suggestions
# for the rest: what the closest thing there is, never put in the command.
_QUANT = {
    "vllm": {"nf4": ["--quantization", "bitsandbytes"]},
    "sglang": {"nf4": ["--quantization", "bitsandbytes"], "torchao-int8": ["--torchao-config", "int8wo"],
               "torchao-int4": ["--torchao-config", "int4wo-128"]},
}
_QUANT_NOTES = {
    ("vllm", "nf4"): "vLLM quantizes in flight to bitsandbytes 4-bit NF4",
    ("sglang", "nf4"): "SGLang quantizes in flight to bitsandbytes 4-bit NF4",
    ("sglang", "torchao-int8"): "torchao int8 weight-only, as here",
    ("sglang", "torchao-int4"): "torchao int4 weight-only in groups of 128, as here",
}
_QUANT_SUGGESTIONS = {
    "native-int8": "the engine's own int8 format (CPU kernels) has no equivalent; closest: `--quantization fp8` "
                   "(8-bit weights and activations, computed as it loads, on a recent GPU)",
    "native-int4": "the engine's own Q4_0-like format has no equivalent; closest: a pre-quantized AWQ/GPTQ "
                   "int4 checkpoint (its --quantization is read from the checkpoint)",
    "int8": "LLM.int8 (bitsandbytes 8-bit) is only read from a pre-quantized checkpoint; closest in flight: "
            "`--quantization bitsandbytes` (4-bit NF4) or `--quantization fp8`",
    "fp4": "bitsandbytes FP4 has no in-flight equivalent; closest: `--quantization bitsandbytes` (4-bit NF4)",
    "quanto-int8": "optimum-quanto has no equivalent; closest: `--quantization fp8`",
    "quanto-int4": "optimum-quanto has no equivalent; closest: a pre-quantized AWQ/GPTQ int4 checkpoint",
    "quanto-float8": "optimum-quanto has no equivalent; closest: `--quantization fp8` (float8 weights)",
    "torchao-int8": "no torchao weight-only flag here; closest: `--quantization fp8`",
    "torchao-int4": "no torchao weight-only flag here; closest: a pre-quantized AWQ/GPTQ int4 checkpoint",
    "sparse-2:4": "2:4 pruning at load time has no equivalent; a 2:4-sparse checkpoint (compressed-tensors) is read "
                  "as such",
}
_VLLM_BLOCK_SIZES = (8, 16, 32, 64, 128)


def _draft_source(config: EngineConfig) -> str:
    return resolve_model(curated_draft(config.model, config.draft_model))[0]


def export_command(config: EngineConfig, target: str) -> ExportResult:
    """The launch command(s) for `config` on `target` ("vllm" or "sglang"), with a row per field."""
    if target not in TARGETS:
        raise ConfigError(f"unknown export target {target!r}; choose one of: {', '.join(TARGETS)}")
    spec = TARGETS[target]
    vllm = target == "vllm"
    rows: list[Row] = []
    flags: list[str] = []
    notes: list[str] = []

    def mapped(field: str, tokens: list[str], note: str = "") -> None:
        flags.extend(tokens)
        rows.append(Row(field, getattr(config, field), " ".join(tokens), note))

    def default(field: str, note: str) -> None:
        rows.append(Row(field, getattr(config, field), None, note))

    def unmapped(field: str, reason: str) -> None:
        rows.append(Row(field, getattr(config, field), None, reason, unmapped=True))

    c = config
    model, model_note = resolve_model(c.model)
    head = ["vllm", "serve", model] if vllm else ["python", "-m", "sglang.launch_server", "--model-path", model]
    rows.append(Row("model", c.model, "vllm serve MODEL" if vllm else "--model-path",
                    model_note or (f"hub id {model}" if model != c.model else "")))

    if c.backend == "hf":
        unmapped("backend", f"the transformers baseline has no equivalent: {spec.label} runs its own engine; "
                            "closest: `--model-impl transformers` (transformers' modeling code inside its engine)")
    elif c.backend == "llama.cpp":
        unmapped("backend", f"llama.cpp is this project's comparison engine; {spec.label} runs its own engine on the "
                            "checkpoint")
    elif c.backend == "remote":
        unmapped("backend", f"this configuration is already served elsewhere ({c.remote_url}); the command below "
                            f"would start {spec.label} on the checkpoint named by model")
    else:
        default("backend", f"{spec.label}'s own engine takes the native engine's place")
    for field in ("remote_url", "remote_model", "remote_api_key_env"):
        if getattr(c, field):
            unmapped(field, "where this playground reaches a served model: no launch flag (the served name would be "
                            "--served-model-name)")
        else:
            default(field, "not served elsewhere")
    if c.gguf_type == "f32":
        default("gguf_type", "the llama.cpp backend's file type: no meaning without it")
    else:
        unmapped("gguf_type", f"gguf_type={c.gguf_type} is a llama.cpp file type; {spec.label} serves the "
                              "checkpoint's own weights (quantize with its --quantization instead)")
    if c.device == "cpu":
        unmapped("device", f"{spec.label} serves on GPUs with this command; a CPU build is a separate install, "
                           "not a flag")
    else:
        default("device", "a GPU (the server's)")
    if c.dtype in _DTYPES:
        mapped("dtype", ["--dtype", _DTYPES[c.dtype]])
    else:
        default("dtype", "auto: the checkpoint's dtype (the engine's auto may pick float32 on a CPU)")

    if c.quantization == "none":
        default("quantization", "full-precision weights")
    elif c.quantization in _QUANT[target]:
        mapped("quantization", _QUANT[target][c.quantization], _QUANT_NOTES[(target, c.quantization)])
    else:
        unmapped("quantization", _QUANT_SUGGESTIONS[c.quantization])

    if c.attention == "auto":
        default("attention", f"{spec.label} picks its attention backend")
    else:
        how = ("the VLLM_ATTENTION_BACKEND environment variable (e.g. FLASH_ATTN)" if vllm
               else "`--attention-backend` (e.g. fa3, flashinfer, triton)")
        unmapped("attention", f"attention={c.attention} is this engine's choice of kernel; {spec.label} has its own "
                              f"backends, chosen with {how}")
    if c.kv_layout == "contiguous":
        unmapped("kv_layout", f"{spec.label}'s KV cache is always paged; there is no contiguous layout")
    else:
        default("kv_layout", "paged, as always there")
    if vllm:
        if c.block_size in _VLLM_BLOCK_SIZES:
            mapped("block_size", ["--block-size", str(c.block_size)])
        else:
            unmapped("block_size", f"vLLM's CUDA block sizes are {', '.join(map(str, _VLLM_BLOCK_SIZES))}")
    else:
        mapped("block_size", ["--page-size", str(c.block_size)], "tokens per KV page")
    if vllm:
        mapped("prefix_caching", ["--enable-prefix-caching" if c.prefix_caching else "--no-enable-prefix-caching"])
    elif c.prefix_caching:
        default("prefix_caching", "the radix cache (prefix caching) is on by default")
    else:
        mapped("prefix_caching", ["--disable-radix-cache"])
    if c.kv_cache_bytes is None:
        default("kv_cache_bytes", "sized from free memory")
    else:
        unmapped("kv_cache_bytes", "a KV budget in bytes has no flag here; closest: "
                 + ("`--gpu-memory-utilization` (the fraction of the GPU for the whole server)" if vllm
                    else "`--max-total-tokens` (the pool in tokens) or `--mem-fraction-static`"))
    if c.kv_memory_fraction is None:
        default("kv_memory_fraction", "the target's default memory fraction")
    else:
        unmapped("kv_memory_fraction", "kv_memory_fraction is a share of the memory left after the weights; closest: "
                 + ("`--gpu-memory-utilization` (a share of the whole GPU, weights included)" if vllm
                    else "`--mem-fraction-static` (weights and KV pool together)"))
    if c.kv_cache_dtype == "auto":
        default("kv_cache_dtype", "the model's dtype")
    elif c.kv_cache_dtype == "int8":
        unmapped("kv_cache_dtype", "an int8 KV cache has no equivalent; closest: `--kv-cache-dtype fp8_e4m3` "
                                   "(8-bit float, on a recent GPU)")
    elif c.kv_cache_dtype == c.dtype:
        default("kv_cache_dtype", "the model's dtype, which --dtype sets")
    else:
        unmapped("kv_cache_dtype", f"the KV cache follows the model's dtype there; kv_cache_dtype={c.kv_cache_dtype} "
                                   f"with another --dtype has no flag (set --dtype {c.kv_cache_dtype} to get it)")
    if c.batching == "static":
        unmapped("batching", f"{spec.label} always batches continuously; static batches have no equivalent")
    else:
        default("batching", "continuous, as always there")
    mapped("max_num_seqs", ["--max-num-seqs" if vllm else "--max-running-requests", str(c.max_num_seqs)])
    if vllm:
        mapped("max_num_batched_tokens", ["--max-num-batched-tokens", str(c.max_num_batched_tokens)])
    else:
        mapped("max_num_batched_tokens", ["--chunked-prefill-size", str(c.max_num_batched_tokens)],
               "closest: prompts are prefilled in chunks of this many tokens (--max-prefill-tokens caps a prefill "
               "batch)")
    if c.max_model_len is None:
        default("max_model_len", "the model's own context length")
    else:
        mapped("max_model_len", ["--max-model-len" if vllm else "--context-length", str(c.max_model_len)])

    _speculation(c, spec, mapped, default, unmapped)

    if c.gqa == "native":
        default("gqa", "the checkpoint's own KV heads")
    else:
        unmapped("gqa", "converting the checkpoint's attention heads (gqa) has no equivalent: serve a checkpoint "
                        "converted beforehand")
    mapped("tensor_parallel_size", ["--tensor-parallel-size" if vllm else "--tp-size", str(c.tensor_parallel_size)])
    mapped("pipeline_parallel_size",
           ["--pipeline-parallel-size" if vllm else "--pp-size", str(c.pipeline_parallel_size)])
    if c.pipeline_micro_batches is None:
        default("pipeline_micro_batches", "the target sizes its own micro-batches")
    else:
        unmapped("pipeline_micro_batches", "the number of micro-batches per step has no flag; "
                 + f"{TARGETS['vllm' if vllm else 'sglang'].label} splits the running batch between stages itself")
    if c.pipeline_schedule == "overlap":
        default("pipeline_schedule", "stages overlap successive batches, as there")
    else:
        unmapped("pipeline_schedule", "a flushed pipeline schedule has no equivalent: the target always overlaps")
    mapped("seed", ["--seed" if vllm else "--random-seed", str(c.seed)])
    if c.cuda_graphs:
        default("cuda_graphs", "CUDA graphs on by default")
    else:
        mapped("cuda_graphs", ["--enforce-eager" if vllm else "--disable-cuda-graph"])
    if c.cpu_kernels:
        default("cpu_kernels", "the engine's CPU kernels do not apply on a GPU server")
    else:
        unmapped("cpu_kernels", "turning off the engine's own CPU kernels has no equivalent (no such kernels there)")

    commands = _commands(c, target, head, flags, rows, notes)
    order = {f.name: i for i, f in enumerate(dataclasses.fields(EngineConfig))}
    rows.sort(key=lambda row: order[row.field])
    return ExportResult(spec, commands, tuple(rows), tuple(notes))


def _speculation(c: EngineConfig, spec: Target, mapped, default, unmapped) -> None:
    vllm = spec.name == "vllm"
    k = c.num_speculative_tokens
    if c.speculative == "off":
        default("speculative", "no speculative decoding")
        default("draft_model", "unused with speculative=off")
        default("num_speculative_tokens", "unused with speculative=off")
        return
    if c.speculative == "ngram":
        if vllm:
            config = {"method": "ngram", "num_speculative_tokens": k,
                      "prompt_lookup_min": NGRAM_MIN, "prompt_lookup_max": NGRAM_MAX}
            mapped("speculative", ["--speculative-config", json.dumps(config, separators=(",", ":"))],
                   f"prompt lookup over n-grams of {NGRAM_MIN} to {NGRAM_MAX} tokens, as here")
            default("num_speculative_tokens", "num_speculative_tokens in --speculative-config")
        else:
            mapped("speculative", ["--speculative-algorithm", "NGRAM"],
                   "SGLang's n-gram speculation (called LOOKAHEAD until sgl-project/sglang#11010, Sept 2025) matches "
                   "a trie of earlier tokens, not our 2-4-token windows; CUDA only")
            mapped("num_speculative_tokens", ["--speculative-num-draft-tokens", str(k)])
        default("draft_model", "unused by n-gram speculation")
        return
    draft = _draft_source(c)
    if vllm:
        unmapped("speculative", f"vLLM {spec.version} refuses a separate draft model (its V1 engine runs ngram, "
                                "EAGLE, Medusa and MTP proposers only; draft models came later, "
                                "vllm-project/vllm#24322); closest: speculative=ngram, or an EAGLE head for the "
                                f"model in --speculative-config (draft would be {draft})")
        unmapped("draft_model", "no draft-model speculation in this vLLM release (see speculative)")
        unmapped("num_speculative_tokens", "no draft-model speculation in this vLLM release (see speculative)")
        return
    mapped("speculative", ["--speculative-algorithm", "STANDALONE"], "a small draft model with the same tokenizer")
    mapped("draft_model", ["--speculative-draft-model-path", draft],
           "" if c.draft_model else f"the curated draft of {c.model}")
    mapped("num_speculative_tokens", ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                                      "--speculative-num-draft-tokens", str(k + 1)],
           f"a chain of {k} drafted tokens (topk 1; the draft-token count includes the verified one)")


def _commands(c: EngineConfig, target: str, head: list[str], flags: list[str], rows: list[Row],
              notes: list[str]) -> tuple[ExportCommand, ...]:
    if c.disaggregation == "off":
        rows.append(Row("disaggregation", c.disaggregation, None, "one server runs prefill and decode"))
        return (ExportCommand("server", tuple(head + flags)),)
    if target == "vllm":
        connector = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, separators=(",", ":"))
        rows.append(Row("disaggregation", c.disaggregation, "--kv-transfer-config",
                        "two servers (prefill, decode) sharing K/V through the NIXL connector"))
        notes.append("vLLM: start both servers (on their own GPUs and ports), then a proxy that sends each request's "
                     "prefill to the first and its decode to the second (vLLM's disaggregated-serving examples "
                     "ship one); NIXL must be installed on both")
        return tuple(ExportCommand(role, tuple(head + flags + ["--port", port, "--kv-transfer-config", connector]))
                     for role, port in (("prefill", "8100"), ("decode", "8200")))
    rows.append(Row("disaggregation", c.disaggregation, "--disaggregation-mode",
                    "two servers, prefill and decode, K/V sent by a transfer backend"))
    notes.append("SGLang: start both servers, then the router: python -m sglang_router.launch_router "
                 "--pd-disaggregation --prefill http://PREFILL_HOST:30000 --decode http://DECODE_HOST:30001; "
                 "the transfer backend (mooncake or nixl) must be installed on both")
    return tuple(ExportCommand(role, tuple(head + flags + ["--port", port, "--disaggregation-mode", role,
                                                           "--disaggregation-transfer-backend", "mooncake"]))
                 for role, port in (("prefill", "30000"), ("decode", "30001")))


def format_export(result: ExportResult) -> str:
    """The command(s), then the table of fields, then what has no equivalent: for a terminal or a file."""
    spec = result.target
    lines = [f"# {spec.label} {spec.version} ({spec.docs})"]
    for command in result.commands:
        if len(result.commands) > 1:
            lines.append(f"# {command.role}")
        lines.append(command.shell)
    lines += ["", "field | value | flag | note"]
    for row in result.rows:
        flag = row.flag or ("UNMAPPED" if row.unmapped else "(default)")
        lines.append(f"{row.field} | {row.value!r} | {flag} | {row.note}")
    if result.unmapped:
        lines += ["", f"Not mapped to {spec.label} {spec.version}:"]
        lines += [f"- {row.field}={row.value!r}: {row.note}" for row in result.unmapped]
    lines += [f"Note: {note}" for note in result.notes]
    return "\n".join(lines)
