"""`python -m engine.gpu_check`: the one script that checks and times the GPU-only paths (a few minutes).

1. Greedy equality, native engine vs `transformers` `generate`, on CUDA, on locally built random
   Llama, Qwen2 and Qwen3 models: float32 must match token for token (TF32 off); bf16 rounding can flip
   near-tied tokens and everything after them, so a bfloat16 row must stay about as close to the
   float32 output as transformers' own bfloat16 run does.
2. Throughput on 64 prompts x 128 random tokens in x 128 out (greedy, EOS ignored): native with
   sdpa, with flash-attn when importable, and without CUDA graphs when the engine has them, against
   the hf backend (transformers' continuous batching).
3. Tensor parallelism (NCCL) when two GPUs are visible: greedy N=2 = N=1 in float32 on the Llama
   model, then N=1 vs N=2 throughput with the share of step time in collectives; with fewer GPUs
   the report says it could not run.
4. Speculative decoding at batch 1 and at 32 concurrent requests: no speculation, a draft model at
   k=4, and n-gram, on a hub-sized random Llama whose draft is its own first layers (the later
   layers are shrunk so that the draft agrees often). The timing shows what verification and the
   draft's forward passes cost on this GPU; the acceptance is an artefact of how the pair was built
   and says nothing about a real pair.
5. The precision table (`python -m engine.precision_table`) on CUDA: the demo model, one row per quantization
   level that runs there (bitsandbytes int8/nf4/fp4 on CUDA, quanto, torchao int8 and int4) and per
   KV head count; then batch-1 decode of a 1.7B-parameter random Llama in bfloat16 against its
   4-bit levels (nf4, torchao-int4), where reading fewer weight bytes per token should win.
6. 2:4 sparsity: the four prefill GEMMs of that 1.7B model's layers (QKV, O, gate/up, down) over 2048 tokens
   in bfloat16, the dense weight against its 2:4-pruned semi-structured form (`sparse-2:4`): times,
   speedup, and the sparse product's largest difference from the dense pruned one.

Needs only torch, transformers, safetensors and tokenizers (flash-attn optional). Results go to
assets/results/gpu_check.json (rewritten after each section) and stdout. Exits with status 2 without
CUDA, 1 if a check fails.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import sys
import tempfile
import time
import traceback
from functools import partial
from pathlib import Path

import torch

from engine.hub import PROJECT_ROOT
from engine.tools.measure import agreement

RESULTS_FILE = PROJECT_ROOT / "assets" / "results" / "gpu_check.json"
EQUALITY_PROMPTS = 8
EQUALITY_TOKENS = 32
MODELS = {
    # name: (config class, model class, config fields). Wider init than usual: peaked logits, so a
    # float32 comparison tests the engine rather than ties between near-equal tokens.
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16,
        num_key_value_heads=4, max_position_embeddings=4096)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=4096)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=4096)),
}
INIT_STD = 0.05
BFLOAT16_SLACK = 0.8  # share of transformers' own bfloat16 agreement with float32 that the native engine must reach
DECODE_MODEL = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=8,
                    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096)
DECODE_LEVELS = ["none", "nf4", "int8", "torchao-int4", "torchao-int8", "quanto-int4"]
SPARSE_PREFILL_TOKENS = 2048
SPARSE_TOLERANCE = 0.05  # largest |sparse - dense pruned| over the output's largest magnitude, bfloat16 rounding
SPEC_LAYERS = 12
SPEC_DRAFT_LAYERS = 2
SPEC_LATER_LAYER_SCALE = 0.05


def build_model(name: str, folder: Path, seed: int = 0) -> str:
    import transformers

    config_name, model_name, fields = MODELS[name]
    torch.manual_seed(seed)
    config = getattr(transformers, config_name)(**fields, initializer_range=INIT_STD, bos_token_id=1,
                                                eos_token_id=2, tie_word_embeddings=False)
    getattr(transformers, model_name)(config).save_pretrained(folder)
    return str(folder)


def reference_greedy(path: str, prompts: list[list[int]], max_new_tokens: int, dtype: torch.dtype,
                     device: str = "cuda") -> list[list[int]]:
    """transformers' own greedy output, one prompt at a time (no padding in the reference)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device).eval()
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=device)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
            outputs.append(out[0, len(prompt):].tolist())
    del model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return outputs


def native_greedy(path: str, prompts: list[list[int]], max_new_tokens: int, dtype: str, device: str = "cuda",
                  **config) -> list[list[int]]:
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.sampling_params import SamplingParams

    with Engine(EngineConfig(model=path, backend="native", device=device, dtype=dtype, **config)) as engine:
        outputs = engine.generate(prompts, SamplingParams(max_tokens=max_new_tokens, ignore_eos=True))
    errors = [o.error for o in outputs if o.finish_reason == "error"]
    if errors:
        raise RuntimeError(errors[0])
    return [o.token_ids for o in outputs]


def check_equality(name: str, path: str, device: str = "cuda") -> list[dict]:
    """Native greedy output against transformers'. float32 must match exactly. bfloat16 rounding flips near-tied
    tokens in both engines, so a bfloat16 row passes when the native engine stays as close to transformers'
    float32 output as transformers' own bfloat16 run does (within BFLOAT16_SLACK)."""
    generator = torch.Generator().manual_seed(1)
    vocab = MODELS[name][2]["vocab_size"]
    lengths = torch.randint(5, 60, (EQUALITY_PROMPTS,), generator=generator).tolist()
    prompts = [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]
    rows = []
    variants = [("float32", {}), ("bfloat16", {}), ("float32", {"batching": "static"}),
                ("float32", {"kv_layout": "contiguous", "prefix_caching": False})]
    if flash_available() and device == "cuda":
        variants.append(("bfloat16", {"attention": "flash-attn", "block_size": 256}))
    references: dict[str, list[list[int]]] = {}

    def reference(dtype_name: str) -> list[list[int]]:
        if dtype_name not in references:
            references[dtype_name] = reference_greedy(path, prompts, EQUALITY_TOKENS, getattr(torch, dtype_name),
                                                      device)
        return references[dtype_name]

    for dtype_name, extra in variants:
        row = {"model": name, "dtype": dtype_name, **extra}
        started = time.perf_counter()
        try:
            got = native_greedy(path, prompts, EQUALITY_TOKENS, dtype_name, device, **extra)
            row.update(agreement(reference(dtype_name), got))
            if dtype_name == "float32":
                row["passed"] = row["exact_sequences"] == row["sequences"]
            else:
                native = agreement(reference("float32"), got)["agreeing_token_fraction"]
                own = agreement(reference("float32"), reference(dtype_name))["agreeing_token_fraction"]
                row.update({"native_vs_float32_reference": native, "transformers_vs_float32_reference": own,
                            "passed": native >= BFLOAT16_SLACK * own})
        except Exception as error:
            row.update({"passed": False, "error": f"{type(error).__name__}: {error}",
                        "traceback": traceback.format_exc(limit=5)})
        row["seconds"] = round(time.perf_counter() - started, 1)
        print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
        rows.append(row)
    return rows


def flash_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def check_throughput(path: str, num_prompts: int, input_len: int, output_len: int) -> list[dict]:
    from engine.tools.bench import build_config, run_config
    from engine.tools.workloads import WorkloadSpec

    spec = WorkloadSpec(num_prompts=num_prompts, input_len=input_len, output_len=output_len, seed=0)
    runs = [("native sdpa", "continuous", {"attention": "sdpa"})]
    if flash_available():
        runs.append(("native flash-attn", "continuous", {"attention": "flash-attn", "block_size": 256}))
        runs.append(("native flash-attn, no CUDA graphs", "continuous",
                     {"attention": "flash-attn", "block_size": 256, "cuda_graphs": False}))
    runs.append(("hf continuous (transformers generate_batch)", "baseline-hf", {}))
    runs.append(("hf static (transformers generate, padded batch)", "hf-static", {"max_num_seqs": num_prompts}))
    rows = []
    for label, preset, extra in runs:
        row = {"run": label}
        try:
            config = build_config(preset, {"model": path, "device": "cuda", "dtype": "bfloat16",
                                           "max_num_seqs": max(64, num_prompts), **extra})
            result = run_config(config, spec, num_prompts, 0.0, True)
            row.update({k: result[k] for k in ("completed", "duration", "output_throughput", "total_token_throughput",
                                               "mean_ttft_ms", "median_tpot_ms", "mean_e2el_ms", "peak_running",
                                               "weights_bytes", "kv_cache_bytes", "peak_memory_bytes", "errors")})
            row["first_error"] = result["first_error"]
        except Exception as error:
            row.update({"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc(limit=5)})
        print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
        rows.append(row)
        gc.collect()
        torch.cuda.empty_cache()
    hf = next((r for r in rows if r["run"].startswith("hf continuous") and "output_throughput" in r), None)
    for row in rows:
        if hf and "output_throughput" in row:
            row["output_throughput_vs_hf_continuous"] = row["output_throughput"] / hf["output_throughput"]
    return rows


def check_tensor_parallel(path: str, num_prompts: int, input_len: int, output_len: int) -> dict:
    """N=1 vs N=2 on two GPUs: float32 greedy equality, then bfloat16 throughput and collective share."""
    from engine.tools.bench import build_config, run_config
    from engine.tools.workloads import WorkloadSpec

    gpus = torch.cuda.device_count()
    if gpus < 2:
        return {"skipped": f"tensor parallelism needs 2 CUDA devices; {gpus} visible", "passed": True}
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, MODELS["llama"][2]["vocab_size"], (n,), generator=generator).tolist()
               for n in (7, 33, 120, 64)]
    report: dict = {}
    try:
        one = native_greedy(path, prompts, EQUALITY_TOKENS, "float32")
        two = native_greedy(path, prompts, EQUALITY_TOKENS, "float32", tensor_parallel_size=2)
        report["equality"] = agreement(one, two)
        report["passed"] = report["equality"]["exact_sequences"] == len(prompts)
        spec = WorkloadSpec(num_prompts=num_prompts, input_len=input_len, output_len=output_len, seed=0)
        for size in (1, 2):
            config = build_config("continuous", {"model": path, "device": "cuda", "dtype": "bfloat16",
                                                 "max_num_seqs": max(64, num_prompts), "tensor_parallel_size": size})
            result = run_config(config, spec, num_prompts, 0.0, True)
            report[f"tp{size}"] = {k: result[k] for k in ("output_throughput", "median_tpot_ms", "collective_share",
                                                          "rank_weights_bytes", "rank_kv_cache_bytes", "errors")}
            report["passed"] = report["passed"] and not result["errors"]
    except Exception as error:
        report.update({"passed": False, "error": f"{type(error).__name__}: {error}",
                       "traceback": traceback.format_exc(limit=5)})
    print(json.dumps({k: v for k, v in report.items() if k != "traceback"}), flush=True)
    return report


def build_decode_model(folder: Path) -> str:
    """A random 1.7B-parameter Llama in bfloat16, initialised on the GPU (fast) and saved."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(LlamaConfig(**DECODE_MODEL, initializer_range=0.02, bos_token_id=1,
                                             eos_token_id=2, tie_word_embeddings=False)).to(torch.bfloat16)
    model.save_pretrained(folder)
    del model
    torch.cuda.empty_cache()
    return str(folder)


def precision_rows(skipped_levels: set[str]) -> tuple[list[dict], list[dict]]:
    """The demo table's rows on CUDA and the decode table's, without the levels the run was told to skip."""
    from engine.tools.precision_table import default_rows

    demo = [row for row in default_rows("demo", "cuda") if row.get("quantization") not in skipped_levels]
    return demo, [{"quantization": level} for level in DECODE_LEVELS if level not in skipped_levels]


def check_precision(decode_folder: Path, skipped_levels: set[str]) -> dict:
    """The precision table on CUDA (demo model), and batch-1 decode at 4 bits vs bfloat16 on a larger model."""
    from engine.tools.precision_table import measure_rows
    from engine.tools.workloads import WorkloadSpec

    base = {"model": "demo", "device": "cuda", "dtype": "bfloat16", "kv_cache_bytes": 64 * 2**20, "max_num_seqs": 32}
    short = WorkloadSpec(num_prompts=4, input_len=128, output_len=32)
    demo_rows, decode_rows = precision_rows(skipped_levels)
    table = measure_rows(base, demo_rows, short, WorkloadSpec(num_prompts=32, input_len=128, output_len=32, seed=1),
                         32)
    path = build_decode_model(decode_folder)
    decode_base = {"model": path, "device": "cuda", "dtype": "bfloat16", "kv_cache_bytes": 2**30, "max_num_seqs": 8}
    decode = measure_rows(decode_base, decode_rows,
                          WorkloadSpec(num_prompts=4, input_len=64, output_len=64),
                          WorkloadSpec(num_prompts=8, input_len=64, output_len=64, seed=1), 8)
    bf16 = next((row for row in decode if row.get("quantization") == "none" and "error" not in row), None)
    four_bit = [row for row in decode if row.get("quantization") in ("nf4", "torchao-int4") and "error" not in row]
    return {"demo_table": table, "decode_model": DECODE_MODEL, "decode_table": decode,
            "four_bit_beats_bfloat16_at_batch_1": (
                {row["quantization"]: row["batch1_tpot_ms"] < bf16["batch1_tpot_ms"] for row in four_bit}
                if bf16 else None)}


def decode_model_gemms() -> dict[str, tuple[int, int]]:
    """(out, in) of each linear layer of the 1.7B decode model, as the native engine fuses them."""
    hidden, heads, kv_heads = (DECODE_MODEL[key] for key in ("hidden_size", "num_attention_heads",
                                                              "num_key_value_heads"))
    head_dim = hidden // heads
    return {"qkv_proj": ((heads + 2 * kv_heads) * head_dim, hidden), "o_proj": (hidden, heads * head_dim),
            "gate_up_proj": (2 * DECODE_MODEL["intermediate_size"], hidden),
            "down_proj": (hidden, DECODE_MODEL["intermediate_size"])}


def _gpu_ms(call) -> float:
    from torch.utils.benchmark import Timer

    return Timer("call(); torch.cuda.synchronize()", globals={"call": call, "torch": torch}).blocked_autorange(
        min_run_time=0.5).median * 1e3


def check_sparse_gemms(tokens: int = SPARSE_PREFILL_TOKENS) -> list[dict]:
    """Each prefill GEMM of the 1.7B model, dense bfloat16 against its 2:4 semi-structured form."""
    import torch.nn.functional as F

    from engine.quant.sparsity import dense_reason, prune_2_4, semi_structured

    rows = []
    generator = torch.Generator(device="cuda").manual_seed(0)
    for layer, (out_features, in_features) in decode_model_gemms().items():
        row = {"layer": layer, "out": out_features, "in": in_features, "tokens": tokens}
        try:
            reason = dense_reason(out_features, in_features, torch.bfloat16, "cuda")
            if reason:
                raise RuntimeError(f"the sparse kernels do not take this layer: {reason}")
            weight = prune_2_4(torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16,
                                           generator=generator) * 0.02)
            x = torch.randn(tokens, in_features, device="cuda", dtype=torch.bfloat16, generator=generator)
            sparse = semi_structured(weight)
            dense_out, sparse_out = F.linear(x, weight), F.linear(x, sparse)
            row["max_error"] = float((sparse_out - dense_out).abs().max() / dense_out.abs().max())
            row["dense_ms"] = _gpu_ms(partial(F.linear, x, weight))
            row["sparse_ms"] = _gpu_ms(partial(F.linear, x, sparse))
            row["speedup"] = row["dense_ms"] / row["sparse_ms"]
            row["passed"] = row["max_error"] <= SPARSE_TOLERANCE
        except Exception as error:
            row.update({"passed": False, "error": f"{type(error).__name__}: {error}",
                        "traceback": traceback.format_exc(limit=5)})
        print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
        rows.append(row)
    return rows


def build_speculative_pair(folder: Path) -> tuple[str, str]:
    """A random 12-layer Llama (~200M parameters, 32k vocabulary) and its first two layers as a draft."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    fields = dict(MODELS["llama"][2], num_hidden_layers=SPEC_LAYERS)
    target = LlamaForCausalLM(LlamaConfig(**fields, initializer_range=INIT_STD, bos_token_id=1, eos_token_id=2,
                                          tie_word_embeddings=False)).eval()
    with torch.no_grad():
        for layer in target.model.layers[SPEC_DRAFT_LAYERS:]:
            layer.self_attn.o_proj.weight.mul_(SPEC_LATER_LAYER_SCALE)
            layer.mlp.down_proj.weight.mul_(SPEC_LATER_LAYER_SCALE)
    target.save_pretrained(folder / "target")
    target.model.layers = target.model.layers[:SPEC_DRAFT_LAYERS]
    target.config.num_hidden_layers = SPEC_DRAFT_LAYERS
    target.save_pretrained(folder / "draft")
    return str(folder / "target"), str(folder / "draft")


def check_speculative(target: str, draft: str, output_len: int, device: str = "cuda",
                      dtype: str = "bfloat16") -> list[dict]:
    """Off / draft k=4 / n-gram at batch 1 (8 requests one after another) and at 32 concurrent requests."""
    from engine.tools.bench import build_config, run_config
    from engine.tools.workloads import WorkloadSpec

    rows = []
    for concurrency, num_prompts in ((1, 8), (32, 32)):
        spec = WorkloadSpec(num_prompts=num_prompts, input_len=128, output_len=output_len, seed=0)
        base = None
        for label, extra in (("off", {}), ("draft k=4", {"speculative": "draft", "draft_model": draft}),
                             ("ngram k=4", {"speculative": "ngram"})):
            row = {"run": f"speculative {label}", "concurrency": concurrency,
                   "note": "random weights: acceptance reflects how the pair was built, not a real draft"}
            try:
                config = build_config(None, {"model": target, "device": device, "dtype": dtype, **extra})
                result = run_config(config, spec, concurrency, 0.0, True)
                row.update({k: result.get(k) for k in (
                    "completed", "output_throughput", "median_tpot_ms", "mean_ttft_ms", "spec_acceptance_rate",
                    "spec_decode_acceptance_length", "weights_bytes", "kv_cache_bytes", "errors", "first_error")})
                if label == "off":
                    base = row
                elif base and base.get("output_throughput") and base.get("median_tpot_ms"):
                    row["output_throughput_vs_off"] = row["output_throughput"] / base["output_throughput"]
                    row["median_tpot_vs_off"] = row["median_tpot_ms"] / base["median_tpot_ms"]
            except Exception as error:
                row.update({"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc(limit=5)})
            print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
            rows.append(row)
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=RESULTS_FILE)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-precision", action="store_true", help="skip the quantization / GQA table")
    parser.add_argument("--skip-speculative", action="store_true")
    parser.add_argument("--skip-levels", default="", help="comma-separated quantization levels to leave out "
                        "(e.g. one whose library compiles CUDA kernels on first use)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: engine.gpu_check needs a CUDA GPU, and torch.cuda.is_available() is False on this machine",
              file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    from engine.core.metrics import describe_device

    started = time.perf_counter()
    report = {"device": describe_device(), "torch": torch.__version__, "flash_attn": flash_available(),
              "equality": [], "throughput": [], "tensor_parallel": {}, "speculative": [], "sparse_gemms": []}
    import transformers

    report["transformers"] = transformers.__version__
    skipped_levels = {level for level in args.skip_levels.split(",") if level}
    report["skipped_levels"] = sorted(skipped_levels)
    print(f"{report['device']} torch {torch.__version__} transformers {transformers.__version__} "
          f"flash_attn={report['flash_attn']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        paths = {name: build_model(name, Path(tmp) / name) for name in MODELS}
        for name, path in paths.items():
            report["equality"].extend(check_equality(name, path))
        write_report(report, args.output, started)
        if not args.skip_throughput:
            report["throughput"] = check_throughput(paths["llama"], args.num_prompts, args.input_len,
                                                    args.output_len)
        report["tensor_parallel"] = check_tensor_parallel(paths["llama"], args.num_prompts, args.input_len,
                                                          args.output_len)
        write_report(report, args.output, started)
        if not args.skip_speculative:
            report["speculative"] = check_speculative(*build_speculative_pair(Path(tmp) / "speculative"),
                                                      args.output_len)
            write_report(report, args.output, started)
        if not args.skip_precision:
            report["precision"] = check_precision(Path(tmp) / "decode", skipped_levels)
            write_report(report, args.output, started)
        report["sparse_gemms"] = check_sparse_gemms()
    report["complete"] = True
    write_report(report, args.output, started)
    print(f"wrote {args.output} in {report['seconds']} s: {'PASSED' if report['passed'] else 'FAILED'}")
    return 0 if report["passed"] else 1


def write_report(report: dict, output: Path, started: float) -> None:
    """Saved after every section, so that a run cut short by a time limit still leaves what it measured."""
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["passed"] = passed(report)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2))


def passed(report: dict) -> bool:
    precision_rows = [*report.get("precision", {}).get("demo_table", []),
                      *report.get("precision", {}).get("decode_table", [])]
    return (report.get("complete", False)
            and all(r["passed"] for r in report["equality"])
            and all("error" not in r and not r.get("errors") for r in report["throughput"] + report["speculative"])
            and report["tensor_parallel"].get("passed", False)
            and all(r["passed"] for r in report.get("sparse_gemms", []))
            and all("error" not in r for r in precision_rows))


if __name__ == "__main__":
    sys.exit(main())
