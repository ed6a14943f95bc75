"""`python -m engine.bench`: run a workload through an engine configuration and report vLLM-style metrics.

The workload (engine/workloads.py) is fixed by its seed, so `--compare` runs a second configuration
on exactly the same requests, in the same process, and prints compare/base ratios. Requests are
sent from a pool of `--concurrency` threads through the public API (`Engine.submit`), at Poisson
arrival times when `--request-rate` is finite. The duration runs from the first submission to the
last completion, after a short untimed warm-up. The measuring itself is `engine/measure.py`, which
the playground's Benchmark and Compare tabs share; `--goodput` adds vLLM's `request_goodput`.

    python -m engine.bench --set model=random-llama-20m --num-prompts 64 --input-len 128 \
        --output-len 128 --compare baseline-hf

`--surge COUNT:INPUT_LEN:OUTPUT_LEN` sends a burst of long prompts into the middle of the workload and
reports the two request classes apart (engine/tools/surge.py); `--sweep-set KEY=V1,V2,...` runs the base
configuration once per value and keeps the best row as the base that `--compare` is set against:

    python -m engine.bench --set model=random-llama-20m --num-prompts 8 --input-len 64 --output-len 128 \
        --surge 16:1024:128 --sweep-set max_num_batched_tokens=256,512,1024,2048 \
        --compare-set disaggregation=prefill-decode

With `--endpoint URL` the same workload goes to an OpenAI-compatible server instead (the playground
serves one at /v1): `--model` names the served model, `--preset`/`--compare` become `MODEL@PRESET`
model ids, and every figure is measured by this client (`engine/remote/`, docs/remote.md: TTFT to the first
streamed text, ITL between streamed chunks, token counts from the server's `usage`); `--api-key-env NAME` sends the
key held in that environment variable.

    python -m engine.bench --endpoint http://127.0.0.1:7860/v1 --model demo --dataset chat \
        --preset no-prefix-cache --compare prefix-cache
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.core.metrics import check_goodput_slos, describe_device, summarize
from engine.errors import ConfigError, EngineError
from engine.hub import PROJECT_ROOT
from engine.overrides import parse_sets, parse_setting
from engine.presets import load_preset
from engine.remote import RemoteEngine, RemoteTarget, RemoteTimeouts
from engine.sampling_params import SamplingParams
from engine.tools.export import TARGETS as EXPORT_TARGETS
from engine.tools.export import export_command, format_export
from engine.tools.measure import bench_report, measure_engine, send, served_figures
from engine.tools.roofline import ceilings_cache_path, device_ceilings
from engine.tools.surge import SURGE_RATIO_KEYS, SURGE_TABLE_KEYS, headline, reference_figures
from engine.tools.workloads import SurgeSpec, WorkloadSpec, build_workload, resolve_dataset, warmup_workload

RANDOM_MODELS = {
    # name: LlamaConfig fields. ~20M parameters: 8.4M in the (untied) embeddings, 2.9M per layer.
    "random-llama-20m": dict(vocab_size=8192, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096,
                             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    # SmolLM2-135M's shape (30 layers, hidden 576, 540 MB in float32): a model beyond the CPU's cache, whose decode
    # steps read their weights from memory.
    "random-smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                                rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
}
RANDOM_MODEL_SEED = 0
RATIO_KEYS = ["output_throughput", "request_throughput", "request_goodput", "total_token_throughput", "mean_ttft_ms",
              "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms", "mean_e2el_ms", "median_e2el_ms",
              "peak_running", "prefix_cache_hit_rate", "weights_bytes", "perplexity", "cpu_ms_per_output_token"]
TABLE_KEYS = ["completed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
              "request_goodput",
              "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
              "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
              "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "peak_running", "prefix_cache_hit_rate",
              "spec_acceptance_rate", "spec_decode_acceptance_length", "cpu_ms_per_output_token", "weights_bytes",
              "kv_cache_bytes", "peak_memory_bytes", "perplexity", "tensor_parallel_size", "executor_seconds",
              "collective_seconds", "collective_share"]
SWEEP_KEYS = ["p99_itl_ms", "median_itl_ms", "p99_ttft_ms", "median_ttft_ms", "output_throughput",
              "total_token_throughput"]
SWEEP_SURGE_KEYS = ["chat_p99_itl_during_surge_ms", "chat_p99_itl_outside_surge_ms", "chat_p99_itl_no_surge_ms",
                    "chat_p99_itl_surge_ratio", "chat_p99_ttft_ms", "surge_median_ttft_ms", "surge_p99_ttft_ms",
                    "total_token_throughput"]


# ---- models ------------------------------------------------------------------------------------

def portable_report_text(report: dict) -> str:
    """The JSON report with this machine's folders written portably (the project root as `.`, the home folder
    as `~`): results are committed, and must not name the folders of the machine that measured them."""
    text = json.dumps(report, indent=2, default=str)
    for folder, portable in ((PROJECT_ROOT, "."), (Path.home(), "~")):
        text = text.replace(json.dumps(str(folder))[1:-1] + "/", portable + "/")
    return text


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "inference-playground"


def make_random_model(name: str, folder: Path) -> Path:
    """Save a randomly initialised Llama (fixed seed, no tokenizer) so benchmarks need no hub access."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return folder
    from safetensors.torch import save_file

    torch.manual_seed(RANDOM_MODEL_SEED)
    model = LlamaForCausalLM(LlamaConfig(**RANDOM_MODELS[name])).eval()
    folder.mkdir(parents=True, exist_ok=True)
    # Written file by file rather than by `save_pretrained`, whose shard progress bar went to stderr on a
    # fresh machine's first bench run: a line nobody can act on.
    model.config.architectures = [type(model).__name__]  # what save_pretrained records, and the engine reads
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    # A tied LM head is stored once, as the embedding (as hub checkpoints store it and the engine's loader reads it).
    tensors = {name: tensor.contiguous() for name, tensor in model.state_dict().items()
               if not (model.config.tie_word_embeddings and name == "lm_head.weight")}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def resolve_bench_model(model: str) -> str:
    """`random-llama-20m` and friends become a folder in the cache; anything else is left to the engine."""
    if model in RANDOM_MODELS:
        return str(make_random_model(model, cache_dir() / model))
    return model


# ---- configuration -----------------------------------------------------------------------------

def build_config(preset: str | None, sets: dict, model: str | None = None) -> EngineConfig:
    """Defaults, then the preset, then --model, then the --set overrides; validated."""
    values = dict(load_preset(preset)) if preset else {}
    if model:
        values["model"] = model
    values.update(sets)
    if "model" in values:
        values["model"] = resolve_bench_model(values["model"])
    return EngineConfig.from_dict(values)


# ---- running -----------------------------------------------------------------------------------

def run_config(config: EngineConfig, spec: WorkloadSpec, concurrency: int, temperature: float,
               ignore_eos: bool, warmup: bool = True, perplexity: bool = False, profile: bool = False,
               goodput_slos: dict[str, float] | None = None, roofline: bool = True) -> dict:
    """Load the engine, measure the workload on it (`engine.tools.measure.measure_engine`), and close it. With
    `roofline`, the run's prefill and decode steps are placed against the device's measured ceilings. A workload
    with a surge is measured a second time without it, on a fresh engine (no prefix cache left over from the
    first): the chat users alone, the reference their gaps during the surge are set against."""
    result = _run_engine(config, spec, concurrency, temperature, ignore_eos, warmup, perplexity, profile,
                         goodput_slos, roofline)
    if spec.surge:
        alone = _run_engine(config, replace(spec, surge=None), concurrency, temperature, ignore_eos, warmup,
                            goodput_slos=goodput_slos, roofline=False)
        result.update(reference_figures(result, alone))
    return result


def _run_engine(config: EngineConfig, spec: WorkloadSpec, concurrency: int, temperature: float,
                ignore_eos: bool, warmup: bool = True, perplexity: bool = False, profile: bool = False,
                goodput_slos: dict[str, float] | None = None, roofline: bool = True) -> dict:
    from engine.engine import Engine

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    engine = Engine(config)
    try:
        return measure_engine(engine, spec, concurrency, temperature, ignore_eos, warmup, perplexity, profile,
                              goodput_slos=goodput_slos, roofline=roofline)
    finally:
        engine.close()
        del engine
        gc.collect()


# ---- an OpenAI-compatible server instead of an in-process engine -------------------------------

def run_endpoint(base_url: str, model: str, spec: WorkloadSpec, concurrency: int, temperature: float,
                 ignore_eos: bool, warmup: bool = True, goodput_slos: dict[str, float] | None = None,
                 api_key_env: str | None = None, timeouts: RemoteTimeouts | None = None) -> dict:
    """The workload against an OpenAI-compatible server through `RemoteEngine`; engine-side figures are whatever
    the server reports. `ignored_parameters` lists what the server was seen not to honour (e.g. `ignore_eos`, which
    makes a fixed-length workload not fixed-length: `fixed_length` says whether it was)."""
    with RemoteEngine(RemoteTarget(base_url, model, api_key_env), timeouts) as remote:
        remote.describe()  # an unknown model or a refused key is said before anything is sent
        loading = remote.submit("Hello", SamplingParams(max_tokens=1))  # loads the served engine
        if loading.result().finish_reason == "error":
            raise loading.exception
        served = remote.describe()  # now with the loaded engine's figures, where the server reports them
        engine = served.get("engine") or {}
        vocab = engine.get("vocab_size")
        if spec.dataset == "random" and not vocab:
            raise EngineError(f"{base_url} does not report the vocabulary size of {model!r}; random prompts need it")
        if warmup:
            send(remote, warmup_workload(spec, vocab or 0), concurrency, temperature, ignore_eos, spec.seed)
        requests = build_workload(spec, vocab or 0)
        outputs, duration = send(remote, requests, concurrency, temperature, ignore_eos, spec.seed)
    errors = [o.error for o in outputs if o.finish_reason == "error"]
    metrics = [o.metrics for o in outputs]
    result = summarize(metrics, duration, goodput_slos)
    prompt_tokens = sum(m.prompt_tokens for m in metrics)
    result.update({
        "num_prompts": len(requests), "errors": len(errors), "first_error": errors[0] if errors else None,
        "prefix_cache_hit_rate": sum(m.cached_tokens for m in metrics) / prompt_tokens if prompt_tokens else 0.0,
        "endpoint": base_url, "model": model, "backend": engine.get("backend"), "attention": engine.get("attention"),
        "dtype": engine.get("dtype"), "device": engine.get("device"), "config": served.get("config") or {},
        "decode_profile_text": None,  # a server's decode steps cannot be profiled from here
        **served_figures(outputs, ignore_eos),
    })
    return result


def ratios(base: dict, compare: dict) -> dict:
    """compare / base for the headline figures (None where base is 0 or missing), a surge run's among them."""
    out = {}
    for key in RATIO_KEYS + [key for key in SURGE_RATIO_KEYS if key in base]:
        a, b = base.get(key), compare.get(key)
        out[key] = (b / a) if isinstance(a, int | float) and isinstance(b, int | float) and a else None
    return out


# ---- output ------------------------------------------------------------------------------------

def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_table(base: dict, compare: dict | None = None, names: tuple[str, str] = ("base", "compare")) -> str:
    rows = [("metric", names[0]) + ((names[1], "compare/base") if compare else ())]
    rat = ratios(base, compare) if compare else {}
    for key in TABLE_KEYS + [key for key in SURGE_TABLE_KEYS if key in base]:
        row = (key, _fmt(base.get(key)))
        if compare:
            ratio = rat.get(key)
            row += (_fmt(compare.get(key)), f"{ratio:.2f}x" if ratio is not None else "")
        rows.append(row)
    return _align(rows)


def sweep_best_by(spec: WorkloadSpec) -> str:
    """What picks a sweep's best row, the lowest wins: the chat users' p99 ITL during the surge (without a surge,
    the p99 ITL), the configuration that protects decoding users best."""
    return "chat_p99_itl_during_surge_ms" if spec.surge else "p99_itl_ms"


def best_row(rows: dict[str, dict], key: str) -> str:
    """The name of the row with the lowest `key` (a row without it is never best while another has it)."""
    return min(rows, key=lambda name: math.inf if rows[name].get(key) is None else rows[name][key])


def format_sweep(rows: dict[str, dict], best: str, surge: bool) -> str:
    """One column per sweep value (the best marked *), the figures a sweep is read for as rows."""
    keys = SWEEP_SURGE_KEYS if surge else SWEEP_KEYS
    table = [("metric", *(name + (" *" if name == best else "") for name in rows))]
    table += [(key, *(_fmt(row.get(key)) for row in rows.values())) for key in keys]
    return _align(table)


def _align(rows: list[tuple[str, ...]]) -> str:
    """Rows of cells as a text table: the first column left-aligned, the others right-aligned, a rule under the
    header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _describe(result: dict) -> str:
    config = result["config"]
    if "endpoint" in result:
        return f"{result['endpoint']} model={result['model']} | " + " ".join(f"{k}={config.get(k)}" for k in (
            "backend", "batching", "max_num_seqs", "kv_layout", "prefix_caching"))
    extra = ""
    if config["speculative"] != "off":
        source = result.get("draft_model") or "n-gram"
        extra = f" speculative={config['speculative']} ({source}) k={config['num_speculative_tokens']}"
    if result["backend"] == "llama.cpp":
        extra += f" gguf_type={config['gguf_type']}"
    return (f"{result['backend']} | batching={config['batching']} max_num_seqs={config['max_num_seqs']} "
            f"kv_layout={config['kv_layout']} prefix_caching={config['prefix_caching']} "
            f"attention={result['attention']} dtype={result['dtype']} device={result['device']} "
            f"quantization={config['quantization']} gqa={config['gqa']} ({result['num_kv_heads']} KV heads)"
            f"{extra}")


# ---- CLI ---------------------------------------------------------------------------------------

def parse_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit() or not 1 <= int(low) <= int(high):
        raise argparse.ArgumentTypeError(f"expected LO:HI with 1 <= LO <= HI, got {text!r}")
    return int(low), int(high)


def parse_goodput_item(text: str) -> tuple[str, float]:
    """One --goodput objective, METRIC:MS (vLLM's form)."""
    name, sep, value = text.partition(":")
    try:
        objective = {name.strip(): float(value)} if sep else {}
        check_goodput_slos(objective)
    except (ValueError, EngineError):
        raise argparse.ArgumentTypeError(f"expected METRIC:MS with METRIC one of ttft, tpot, e2el and MS > 0, "
                                         f"got {text!r}") from None
    if not objective:
        raise argparse.ArgumentTypeError(f"expected METRIC:MS, got {text!r}")
    return next(iter(objective.items()))


def parse_surge(text: str) -> tuple[int, int, int]:
    """--surge COUNT:INPUT_LEN:OUTPUT_LEN."""
    parts = text.split(":")
    if len(parts) != 3 or not all(part.strip().isdigit() and int(part) >= 1 for part in parts):
        raise argparse.ArgumentTypeError(f"expected COUNT:INPUT_LEN:OUTPUT_LEN, each at least 1, got {text!r}")
    count, input_len, output_len = (int(part) for part in parts)
    return count, input_len, output_len


def parse_sweep(text: str) -> tuple[str, list]:
    """--sweep-set KEY=V1,V2,...: the field and its values, each read as --set reads it."""
    key, sep, values = text.partition("=")
    items = [value for value in values.split(",") if value.strip()]
    if not sep or not key.strip() or not items:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE,VALUE,..., got {text!r}")
    return key.strip(), [parse_setting(key.strip(), value) for value in items]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", help="optimization preset name (presets/NAME.toml) or path")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override an EngineConfig field (repeatable), e.g. --set max_num_seqs=64")
    parser.add_argument("--model", help="shortcut for --set model=...; random-llama-20m builds a local random model")
    parser.add_argument("--compare", metavar="PRESET", help="also run this preset (plus the same --set/--model) "
                        "on the same requests and print compare/base ratios")
    parser.add_argument("--compare-set", dest="compare_sets", action="append", default=[], metavar="KEY=VALUE",
                        help="overrides applied only to the --compare run (after its preset); without --compare, "
                             "the compare run is the base preset with these overrides")
    parser.add_argument("--sweep-set", dest="sweep", type=parse_sweep, metavar="KEY=V1,V2,...",
                        help="run the base configuration once per value of this field (after --set) and report "
                             "each; the best (lowest chat p99 ITL during the surge, else lowest p99 ITL) is the base "
                             "that --compare is set against")
    parser.add_argument("--dataset", default="random", help="random | chat | path to a .jsonl of prompts")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128, help="unique tokens per random prompt")
    parser.add_argument("--input-len-range", type=parse_range, metavar="LO:HI",
                        help="draw each random prompt's own tokens uniformly from LO..HI (mixed lengths)")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--output-len-range", type=parse_range, metavar="LO:HI",
                        help="draw each request's output length uniformly from LO..HI (mixed lengths)")
    parser.add_argument("--prefix-len", type=int, default=0, help="shared prefix tokens before each random prompt")
    parser.add_argument("--surge", type=parse_surge, metavar="COUNT:INPUT_LEN:OUTPUT_LEN",
                        help="a second request class: COUNT random prompts of INPUT_LEN tokens asking OUTPUT_LEN each, "
                             "sent once the workload's own requests (the chat users) are --surge-after tokens into "
                             "their answers; each class is reported apart, and the chat users are also run alone")
    parser.add_argument("--surge-after", type=int, metavar="TOKENS",
                        help="release the surge once the chat requests have streamed this many tokens each on "
                             "average (default: half of --output-len)")
    parser.add_argument("--surge-rate", type=float, default=math.inf, metavar="RATE",
                        help="Poisson arrivals per second of the surge's prompts, from its release (default: all at "
                             "once)")
    parser.add_argument("--concurrency", type=int, default=None, help="max requests in flight (default: all)")
    parser.add_argument("--request-rate", type=float, default=math.inf, help="Poisson arrivals per second")
    parser.add_argument("--goodput", nargs="+", type=parse_goodput_item, metavar="METRIC:MS",
                        help="service-level objectives (ttft, tpot, e2el in ms), e.g. --goodput ttft:200 tpot:50: "
                             "adds request_goodput, the completed requests per second that met all of them (vLLM)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=None,
                        help="generate exactly the output length (default: on for random prompts)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up requests")
    parser.add_argument("--perplexity", action="store_true",
                        help="also measure each configuration's perplexity on the demo model's held-out text")
    parser.add_argument("--profile", action="store_true",
                        help="after each native run, print its decode steps against their matmul floor (step time, "
                             "floor, ratio, shares of attention, KV writes/gathers, LM head, sampling, scheduling, "
                             "minor page faults per step)")
    parser.add_argument("--no-roofline", action="store_true",
                        help="skip placing each native run's prefill and decode steps on the device's roofline "
                             "(its ceilings are measured once per device and dtype, then read from a cache file)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run base and --compare alternately this many times each (interleaved, so that a "
                             "change in machine load hits both) and print each round's ratios and their median")
    parser.add_argument("--threads", type=int, help="torch CPU threads (torch.set_num_threads) for every run")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--endpoint", metavar="URL", help="benchmark an OpenAI-compatible server (its /v1 base URL) "
                        "instead of an in-process engine; --model names the served model")
    parser.add_argument("--api-key-env", metavar="NAME", help="with --endpoint: the environment variable holding the "
                        "server's API key (sent as a Bearer header; never printed)")
    parser.add_argument("--first-token-timeout", type=float, default=600.0, metavar="S",
                        help="with --endpoint: seconds from sending a request to its first streamed text")
    parser.add_argument("--inter-token-timeout", type=float, default=120.0, metavar="S",
                        help="with --endpoint: seconds between two streamed texts")
    parser.add_argument("--ceilings", action="store_true",
                        help="only print this device's roofline ceilings in --set dtype (default float32) and exit: "
                             "measured once, then read from the cache file")
    parser.add_argument("--refresh-ceilings", action="store_true",
                        help="measure the ceilings again (keeping the best of each) before using them")
    parser.add_argument("--make-random-model", metavar="FOLDER", type=Path,
                        help="only build random-llama-20m into FOLDER and exit")
    parser.add_argument("--export", choices=sorted(EXPORT_TARGETS),
                        help="only print the equivalent launch command of this serving engine for the configuration "
                             "(--preset, --set, --model), each setting mapped or named as unmapped, and exit")
    return parser


def workload_spec(args: argparse.Namespace, dataset: str) -> WorkloadSpec:
    """The workload the command line describes (a ConfigError for a surge it cannot describe)."""
    surge = None
    if args.surge:
        count, input_len, output_len = args.surge
        after = args.output_len // 2 if args.surge_after is None else args.surge_after
        surge = SurgeSpec(count, input_len, output_len, after, args.surge_rate)
    return WorkloadSpec(dataset=dataset, num_prompts=args.num_prompts, input_len=args.input_len,
                        output_len=args.output_len, output_len_range=args.output_len_range,
                        input_len_range=args.input_len_range, prefix_len=args.prefix_len,
                        request_rate=args.request_rate, seed=args.seed, surge=surge)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.make_random_model:
        folder = make_random_model("random-llama-20m", args.make_random_model)
        print(f"random-llama-20m saved in {folder}")
        return 0
    if args.export:
        try:
            config = build_config(args.preset, parse_sets(args.sets), args.model)
        except ConfigError as error:
            parser.error(str(error))
        print(format_export(export_command(config, args.export)))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.ceilings or args.refresh_ceilings:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = parse_sets(args.sets).get("dtype", "auto")
        if dtype == "auto":  # what the engine resolves `auto` to for most checkpoints
            dtype = "bfloat16" if device == "cuda" else "float32"
        ceilings = device_ceilings(device, dtype, refresh=args.refresh_ceilings)
        print(f"{ceilings.describe()}; cache file: {ceilings_cache_path()}")
        if args.ceilings:
            return 0
    if args.endpoint and (args.surge or args.sweep):
        parser.error("--surge and --sweep-set need an in-process engine: a surge waits for the chat users' streamed "
                     "tokens, and a sweep builds configurations")
    if not args.surge and (args.surge_after is not None or not math.isinf(args.surge_rate)):
        parser.error("--surge-after and --surge-rate describe a --surge")
    if not args.endpoint and (args.api_key_env or args.first_token_timeout != 600.0
                              or args.inter_token_timeout != 120.0):
        parser.error("--api-key-env, --first-token-timeout and --inter-token-timeout go with --endpoint")
    try:
        if args.endpoint:  # the served configurations are MODEL@PRESET ids; the server resolves them
            timeouts = RemoteTimeouts(first_token=args.first_token_timeout, inter_token=args.inter_token_timeout)
            model = args.model or parse_sets(args.sets).get("model") or "demo"
            base_configs = {"base": f"{model}@{args.preset}" if args.preset else model}
            compare_config = f"{model}@{args.compare}" if args.compare else None
        else:
            sets = parse_sets(args.sets)
            if args.sweep:
                key, values = args.sweep
                base_configs = {f"{key}={value}": build_config(args.preset, {**sets, key: value}, args.model)
                                for value in values}
            else:
                base_configs = {"base": build_config(args.preset, sets, args.model)}
            model = next(iter(base_configs.values())).model
            compare_config = None
            if args.compare or args.compare_sets:
                compare_sets = {**sets, **parse_sets(args.compare_sets)}
                compare_config = build_config(args.compare or args.preset, compare_sets, args.model or model)
        spec = workload_spec(args, resolve_dataset(args.dataset, model))
    except EngineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    ignore_eos = args.ignore_eos if args.ignore_eos is not None else args.dataset == "random"
    concurrency = args.concurrency or args.num_prompts + (spec.surge.count if spec.surge else 0)
    goodput_slos = dict(args.goodput or [])
    print(f"{describe_device()}; torch threads: {torch.get_num_threads()}")
    print(f"workload: {json.dumps(asdict(spec), default=str)} "
          f"concurrency={concurrency} temperature={args.temperature} ignore_eos={ignore_eos}")
    runs = [*base_configs.items(), *([("compare", compare_config)] if compare_config else [])]
    results: dict[str, dict] = {}
    round_ratios: list[dict] = []
    try:
        for round_index in range(max(1, args.rounds)):
            this_round = {}
            for name, config in runs:
                if args.endpoint:
                    this_round[name] = run_endpoint(args.endpoint, config, spec, concurrency, args.temperature,
                                                    ignore_eos, not args.no_warmup, goodput_slos, args.api_key_env,
                                                    timeouts)
                else:
                    this_round[name] = run_config(config, spec, concurrency, args.temperature, ignore_eos,
                                                  not args.no_warmup, args.perplexity, args.profile, goodput_slos,
                                                  not args.no_roofline)
                if round_index == 0:
                    print(f"{name}: {_describe(this_round[name])}")
            results = results or this_round
            if "compare" in this_round:
                best = best_row({name: this_round[name] for name in base_configs}, sweep_best_by(spec))
                round_ratios.append(ratios(this_round[best], this_round["compare"]))
    except EngineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = {name: results[name] for name in base_configs}
    best = best_row(rows, sweep_best_by(spec))
    if args.sweep:
        print(f"sweep of {args.sweep[0]} (* the best: lowest {sweep_best_by(spec)})")
        print(format_sweep(rows, best, bool(spec.surge)))
    base, compare = results[best], results.get("compare")
    base_name = " ".join(name for name in (args.preset, None if best == "base" else best) if name) or "base"
    print(format_table(base, compare, (base_name, args.compare or " ".join(args.compare_sets) or "compare")))
    if spec.surge:
        for name, result in results.items():
            print(f"{name}: {headline(result)}")
    for name, result in results.items():
        if result["decode_profile_text"]:
            print(f"{name} ({result['backend']}, {result['attention']}): {result['decode_profile_text']}")
    for name, result in results.items():
        if result.get("roofline_text"):
            print(f"{name}: {result['roofline_text']}")
    for name, result in results.items():
        for parameter, seen in (result.get("ignored_parameters") or {}).items():
            consequence = "; the fixed-length workload was not fixed-length" if parameter == "ignore_eos" else ""
            print(f"{name}: the server did not honour {parameter} ({seen}){consequence}", file=sys.stderr)
        if result["errors"]:
            print(f"{name}: {result['errors']} request(s) failed, e.g. {result['first_error']}", file=sys.stderr)
    report = bench_report(base, spec, concurrency, args.temperature, ignore_eos, args.preset, goodput_slos)
    if args.sweep:
        key, values = args.sweep
        report["sweep"] = {"key": key, "values": values, "best": values[list(rows).index(best)],
                           "best_by": sweep_best_by(spec),
                           "rows": [{"value": value, **row} for value, row in zip(values, rows.values(), strict=True)]}
    if compare:
        report["compare_preset"] = args.compare
        report["compare_sets"] = parse_sets(args.compare_sets)
        report["compare"] = compare
        report["ratios"] = ratios(base, compare)
        print("ratios compare/base: " + ", ".join(f"{k}={v:.2f}x" for k, v in report["ratios"].items()
                                                 if v is not None))
    if len(round_ratios) > 1:
        report["round_ratios"] = round_ratios
        surge_keys = ("chat_p99_itl_during_surge_ms", "surge_p99_ttft_ms", "total_token_throughput") \
            if spec.surge else ()
        for key in ("output_throughput", "cpu_ms_per_output_token", "mean_tpot_ms", "median_tpot_ms", *surge_keys):
            values = [r[key] for r in round_ratios if r.get(key) is not None]
            if values:
                print(f"{key} compare/base per round: {' '.join(f'{v:.2f}x' for v in values)}; "
                      f"median {statistics.median(values):.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(portable_report_text(report))
        print(f"wrote {args.json}")
    return 1 if any(r["errors"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
