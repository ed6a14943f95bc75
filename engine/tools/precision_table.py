"""`python -m engine.precision_table`: what each quantization level and GQA setting costs and buys, one process.

One row per quantization level available on the device (and `none`), then one per KV head count the
model converts to (the demo target: 8, 4, 2, 1), then one per KV cache dtype other than `auto`.
Every row's engine is loaded with the same `kv_cache_bytes`, then all are timed round-robin on the
same requests (median over `--rounds`), so a burst of load on a shared machine hits every row alike:
weights bytes (packed storage plus scales), KV bytes per token, the KV blocks that fit, batch-1 TTFT
and TPOT (requests sent one at a time), output throughput with `--concurrency` requests in flight.
Quality, on the demo model's held-out text, in one pass over every row together: perplexity, and
against the `quantization=none` row position by position the mean KL(p_none || p_row) of the
next-token distribution and the share of positions whose most likely token agrees; plus the share of
the batch-1 requests' greedy tokens generated before each first differs from the `none` row's.
`make gpu-check` produces the same table on a GPU.

    python -m engine.precision_table --model demo --json assets/results/cpu/precision.json
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.config import CHOICES, EngineConfig, unavailable_reason
from engine.core.metrics import describe_device, summarize
from engine.core.perplexity import NextTokenLoss
from engine.engine import quiet_other_engines
from engine.errors import EngineError
from engine.host import resolve_device
from engine.hub import load_hf_config, resolve_model_path
from engine.model.gqa import kv_head_options
from engine.model.spec import ModelSpec
from engine.overrides import parse_sets, parse_value
from engine.quant.levels import LEVELS
from engine.tools.bench import portable_report_text, resolve_bench_model
from engine.tools.measure import agreement, send, source_revision
from engine.tools.workloads import WorkloadSpec, build_workload, warmup_workload

COLUMNS = [("row", "row"), ("weights_bytes", "weights MB"), ("weights_ratio", "x none"),
           ("kv_bytes_per_token", "KV B/token"), ("kv_blocks", "blocks"), ("batch1_ttft_ms", "b1 TTFT ms"),
           ("batch1_tpot_ms", "b1 TPOT ms"), ("batch1_tpot_ratio", "TPOT x none"),
           ("concurrent_output_throughput", "tok/s @N"), ("throughput_ratio", "tok/s x none"),
           ("perplexity", "held-out ppl"), ("kl_vs_none", "KL vs none"), ("top1_agreement", "top-1 agree"),
           ("greedy_agreement", "greedy agree")]


def default_rows(model: str, device: str) -> list[dict]:
    """Every level that can run on `device`, every KV head count the checkpoint converts to, every KV dtype."""
    spec = ModelSpec.from_hf_config(load_hf_config(resolve_model_path(model)))
    rows = [{"quantization": name} for name in ["none", *LEVELS]
            if unavailable_reason("quantization", name, device) is None]
    rows += [{"gqa": heads} for heads in sorted(kv_head_options(spec.num_heads, spec.num_kv_heads), reverse=True)]
    return rows + kv_dtype_rows(device)


def kv_dtype_rows(device: str) -> list[dict]:
    """One row per KV cache dtype besides "auto" (the model's own) usable on `device`."""
    return [{"kv_cache_dtype": value} for value in CHOICES["kv_cache_dtype"]
            if value != "auto" and unavailable_reason("kv_cache_dtype", value, device) is None]


def row_label(changes: dict) -> str:
    return ", ".join(f"{key}={value}" for key, value in changes.items())


def _timed_run(engine, spec: WorkloadSpec, concurrency: int, warm_up: bool) -> tuple[dict, list[list[int]]]:
    """The run's summary and each request's greedy tokens, once every other row's loop thread has ended
    (quiet_other_engines): all rows stay loaded while each is timed."""
    quiet_other_engines(engine)
    vocab = engine.info.vocab_size
    if warm_up:
        send(engine, warmup_workload(spec, vocab), concurrency, 0.0, True, spec.seed)
    outputs, duration = send(engine, build_workload(spec, vocab), concurrency, 0.0, True, spec.seed)
    failed = [o.error for o in outputs if o.finish_reason == "error"]
    if failed:
        raise EngineError(f"{len(failed)} request(s) failed, e.g. {failed[0]}")
    return summarize([o.metrics for o in outputs], duration), [o.token_ids for o in outputs]


def _load_row(base: dict, changes: dict) -> tuple[object, dict]:
    """The row's engine and the figures it has once loaded (memory, heads, load time)."""
    from engine.engine import Engine

    started = time.perf_counter()
    engine = Engine(EngineConfig.from_dict({**base, **changes}))
    stats, info = engine.stats(), engine.info
    return engine, {"weights_bytes": stats.weights_bytes, "kv_bytes_per_token": info.kv_bytes_per_token,
                    "num_kv_heads": info.num_kv_heads, "kv_blocks": stats.kv_blocks_total,
                    "kv_cache_bytes": stats.kv_cache_bytes, "load_seconds": time.perf_counter() - started,
                    "dtype": info.dtype, "device": info.device, "notices": list(info.notices)}


def _speed_rounds(engines: dict, results: list[dict], batch1: WorkloadSpec, concurrent: WorkloadSpec,
                  concurrency: int, rounds: int) -> None:
    """Round-robin over the loaded rows, so a burst of load on a shared machine hits every row alike."""
    samples: dict[int, list[tuple[dict, dict]]] = {index: [] for index in engines}
    for round_index in range(rounds):
        for index, engine in list(engines.items()):
            try:
                single, greedy = _timed_run(engine, batch1, 1, round_index == 0)
                samples[index].append((single, _timed_run(engine, concurrent, concurrency, round_index == 0)[0]))
                results[index]["greedy_tokens"] = greedy
            except Exception as error:  # one broken level must not lose the other rows' measurements
                results[index]["error"] = f"{type(error).__name__}: {error}"
                engines.pop(index).close()
    for index in engines:
        single, many = zip(*samples[index], strict=True)
        results[index].update({
            "batch1_ttft_ms": statistics.median(s["mean_ttft_ms"] for s in single),
            "batch1_tpot_ms": statistics.median(s["median_tpot_ms"] for s in single),
            "concurrent_output_throughput": statistics.median(m["output_throughput"] for m in many),
            "concurrent_mean_ttft_ms": statistics.median(m["mean_ttft_ms"] for m in many), "rounds": rounds})


def reference_index(rows: list[dict]) -> int | None:
    """The `quantization=none` row every other row is compared with, unless it failed."""
    return next((index for index, row in enumerate(rows) if row.get("quantization") == "none" and "error" not in row),
                None)


def add_ratios(rows: list[dict]) -> None:
    """Each row against the `quantization=none` row measured in the same run: speed, bytes, greedy tokens."""
    reference = reference_index(rows)
    if reference is None:
        return
    base = rows[reference]
    for row in rows:
        if "error" in row:
            continue
        row["weights_ratio"] = row["weights_bytes"] / base["weights_bytes"]
        row["batch1_tpot_ratio"] = row["batch1_tpot_ms"] / base["batch1_tpot_ms"]
        row["throughput_ratio"] = row["concurrent_output_throughput"] / base["concurrent_output_throughput"]
        row["greedy_agreement"] = agreement(base["greedy_tokens"], row["greedy_tokens"])["agreeing_token_fraction"]


# Quality is scored in steps of this many tokens over the cache, so that every position after a window's first step
# attends as a generated token does (over the KV pool, through the CPU kernel where it serves decode): a KV format's
# cost includes how the decode path reads it, not only how it rounds what it stores.
QUALITY_CHUNK_TOKENS = 16


def held_out_quality(engines: dict, reference: int | None) -> dict[int, dict]:
    """Perplexity of every row, and against the reference row the mean KL(p_ref || p_row) over the held-out
    positions and the share whose most likely next token agrees; one pass over every row together, so only one
    window of [positions, vocab] log-probabilities per row is held at a time and the reference is scored once."""
    streams = {index: engine.next_token_log_probs(chunk_tokens=QUALITY_CHUNK_TOKENS)
               for index, engine in engines.items()}
    losses = {index: NextTokenLoss() for index in engines}
    kl = dict.fromkeys(engines, 0.0)
    agree = dict.fromkeys(engines, 0)
    positions = 0
    for windows in zip(*streams.values(), strict=True):
        scored = dict(zip(streams, windows, strict=True))
        for index, window in scored.items():
            losses[index].add(window)
        if reference not in scored:
            continue
        base = scored[reference].log_probs.double()
        base_top = base.argmax(-1)
        positions += len(base)
        for index, window in scored.items():
            row = window.log_probs.double()
            kl[index] += float(F.kl_div(row, base, log_target=True, reduction="sum"))
            agree[index] += int((row.argmax(-1) == base_top).sum())
    figures = {index: {"perplexity": loss.perplexity, "perplexity_tokens": loss.tokens}
               for index, loss in losses.items()}
    if positions:
        for index in engines:
            figures[index].update(kl_vs_none=kl[index] / positions, top1_agreement=agree[index] / positions)
    return figures


def measure_rows(base: dict, rows: list[dict], batch1: WorkloadSpec, concurrent: WorkloadSpec,
                 concurrency: int, rounds: int = 3) -> list[dict]:
    """Load every row, time them round-robin (medians over `rounds`), then measure their quality on the held-out
    text together (when the model has a tokenizer: a checkpoint of token ids alone has no text to score).

    A row that fails to load or run records its error and the table goes on.
    """
    results = [{"row": row_label(changes), **changes} for changes in rows]
    engines = {}
    try:
        for index, changes in enumerate(rows):
            try:
                engines[index], figures = _load_row(base, changes)
                results[index].update(figures)
            except Exception as error:
                results[index]["error"] = f"{type(error).__name__}: {error}"
        _speed_rounds(engines, results, batch1, concurrent, concurrency, rounds)
        scored = {index: engine for index, engine in engines.items() if engine.tokenizer is not None}
        reference = reference_index(results)
        for index, figures in held_out_quality(scored, reference if reference in scored else None).items():
            results[index].update(figures)
    finally:
        for engine in engines.values():
            engine.close()
        gc.collect()
    add_ratios(results)
    for row in results:
        print(format_row(row), flush=True)
    return results


def _cell(key: str, value) -> str:
    if value is None:
        return "-"
    if key == "weights_bytes":
        return f"{value / 1e6:.2f}"
    if key.endswith("ratio"):
        return f"{value:.2f}x"
    if key == "kl_vs_none":
        return f"{value:.4f}"
    if key.endswith("agreement"):
        return f"{value:.3f}"
    if isinstance(value, float):
        return f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return str(value)


def format_row(row: dict) -> str:
    if "error" in row:
        return f"| {row['row']} | error: {row['error']} |"
    return "| " + " | ".join(_cell(key, row.get(key)) for key, _ in COLUMNS) + " |"


def format_table(rows: list[dict]) -> str:
    header = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    return "\n".join([header, "|" + " --- |" * len(COLUMNS), *(format_row(row) for row in rows)])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine.precision_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="EngineConfig field for every row (e.g. device=cuda, dtype=bfloat16)")
    parser.add_argument("--row", dest="rows", action="append", default=[], metavar="KEY=VALUE",
                        help="measure only these rows (repeatable), e.g. --row quantization=nf4 --row gqa=2")
    parser.add_argument("--kv-cache-bytes", type=parse_value, default=64 * 2**20)
    parser.add_argument("--batch1-prompts", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds over all rows (medians are reported)")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--json", type=Path, help="write the rows and the setup here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = resolve_bench_model(args.model)
    try:
        base = {"model": model, "kv_cache_bytes": args.kv_cache_bytes, "max_num_seqs": max(32, args.concurrency),
                **parse_sets(args.sets)}
        rows = [parse_sets([item]) for item in args.rows]
    except EngineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = rows or default_rows(model, resolve_device(base.get("device", "auto")))
    batch1 = WorkloadSpec(num_prompts=args.batch1_prompts, input_len=args.input_len, output_len=args.output_len)
    concurrent = WorkloadSpec(num_prompts=args.concurrency, input_len=args.input_len, output_len=args.output_len,
                              seed=1)
    print(f"{describe_device()}; torch threads: {torch.get_num_threads()}; {len(rows)} rows, one process")
    print(format_table([]))
    results = measure_rows(base, rows, batch1, concurrent, args.concurrency, args.rounds)
    print()
    print(format_table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(portable_report_text({
            "command": "python -m engine.precision_table " + " ".join(argv if argv is not None else sys.argv[1:]),
            "device_name": describe_device(), "torch_threads": torch.get_num_threads(),
            "source_revision": source_revision(), "base": base,
            "workloads": {"batch1": asdict(batch1), "concurrent": asdict(concurrent),
                          "concurrency": args.concurrency},
            "rows": results}))
        print(f"wrote {args.json}")
    return 1 if any("error" in row for row in results) else 0


if __name__ == "__main__":
    sys.exit(main())
