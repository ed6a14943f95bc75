"""`python -m engine.tools.guided_cost`: what guided decoding costs, measured directly in the engine's steps.

For one JSON schema, on one engine configuration: the compile time apart (llguidance's view of the tokenizer, built
once per engine; the schema's first compile; a cached look-up), then the same requests guided and unguided, one at
a time (batch 1) and all at once (`--concurrency`, 32 by default). The figure the bar is set on is the mask work
per decode step (computing the bitmasks + applying them, `StepRecord.guided_mask_duration`) as a share of the
guided requests' TPOT; the unguided run's TPOT and the process CPU time per output token of both runs are the
second view (the unguided requests get exactly as many tokens as the guided ones did, with `ignore_eos`). With
speculative decoding (`--set speculative=ngram`) steps that verify proposals count as decode steps, and the
acceptance rates of both runs are shown.

    python -m engine.tools.guided_cost --schema assets/guided/event.json --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.overrides import parse_sets
from engine.sampling_params import GuidedDecoding, SamplingParams

TRIVIAL = GuidedDecoding("regex", "a")


def prompts(count: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Describe event number {i} as JSON."}] for i in range(count)]


def run(engine: Engine, count: int, concurrency: int, params: list[SamplingParams]) -> dict:
    """Serve `count` requests, `concurrency` at a time; the decode steps' figures and the requests' TPOT."""
    since = time.perf_counter()
    cpu = time.process_time()
    outputs, messages = [], prompts(count)
    for start in range(0, count, concurrency):
        handles = [engine.submit(messages[i], params[i]) for i in range(start, min(start + concurrency, count))]
        outputs += [handle.result() for handle in handles]
    cpu = time.process_time() - cpu
    steps = [s for s in engine.step_history(since) if s.num_tokens == s.num_decode_tokens]  # decode-only steps
    proposed = sum(s.spec_proposed for s in steps)
    tokens = sum(len(o.token_ids) for o in outputs)
    return {"outputs": outputs, "tokens": tokens, "finish": sorted({o.finish_reason for o in outputs}),
            "tpot_ms": 1e3 * statistics.mean(o.metrics.tpot for o in outputs if o.metrics.tpot),
            "step_ms": 1e3 * statistics.mean(s.duration for s in steps),
            "mask_ms": 1e3 * statistics.mean(s.guided_mask_duration for s in steps),
            "mean_batch": statistics.mean(s.batch_size for s in steps), "cpu_ms_per_token": 1e3 * cpu / tokens,
            "acceptance": sum(s.spec_accepted for s in steps) / proposed if proposed else None}


def measure(engine: Engine, guided: GuidedDecoding, count: int, concurrency: int, temperature: float) -> dict:
    guided_params = [SamplingParams(max_tokens=256, temperature=temperature, seed=i, guided=guided)
                     for i in range(count)]
    with_grammar = run(engine, count, concurrency, guided_params)
    plain_params = [SamplingParams(max_tokens=len(o.token_ids), temperature=temperature, seed=i, ignore_eos=True)
                    for i, o in enumerate(with_grammar["outputs"])]
    without = run(engine, count, concurrency, plain_params)
    return {"concurrency": concurrency, "requests": count, "finish_reasons": with_grammar["finish"],
            "mean_decode_batch": with_grammar["mean_batch"],
            "mask_ms_per_step": with_grammar["mask_ms"], "guided_step_ms": with_grammar["step_ms"],
            "guided_tpot_ms": with_grammar["tpot_ms"], "unguided_tpot_ms": without["tpot_ms"],
            "mask_share_of_tpot": with_grammar["mask_ms"] / with_grammar["tpot_ms"],
            "guided_cpu_ms_per_token": with_grammar["cpu_ms_per_token"],
            "unguided_cpu_ms_per_token": without["cpu_ms_per_token"],
            "guided_acceptance": with_grammar["acceptance"], "unguided_acceptance": without["acceptance"]}


def compile_times(engine: Engine, guided: GuidedDecoding) -> dict:
    """Milliseconds: llguidance's tokenizer view with a trivial regex, the schema's first compile, a cached one."""
    times = []
    for spec in (TRIVIAL, guided, guided):
        started = time.perf_counter()
        engine.check_guided(spec)
        times.append(1e3 * (time.perf_counter() - started))
    return {"tokenizer_and_trivial_ms": times[0], "schema_compile_ms": times[1], "cached_ms": times[2]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schema", type=Path, required=True, help="a JSON schema file")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="EngineConfig field (model=demo unless set)")
    parser.add_argument("--requests", type=int, default=32, help="requests per run")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    guided = GuidedDecoding("json_schema", args.schema.read_text(encoding="utf-8"))
    config = EngineConfig(**{"model": "demo", "max_num_seqs": args.concurrency, **parse_sets(args.sets)})
    with Engine(config) as engine:
        report = {"config": {k: v for k, v in vars(args).items() if k != "json"} | {"schema": str(args.schema)},
                  "device": engine.info.device_name, "compile": compile_times(engine, guided),
                  "runs": [measure(engine, guided, args.requests, concurrency, args.temperature)
                           for concurrency in (1, args.concurrency)]}
    compile_ms = report["compile"]
    print(f"{report['device']}\ncompile: tokenizer view + trivial regex {compile_ms['tokenizer_and_trivial_ms']:.1f} "
          f"ms, schema {compile_ms['schema_compile_ms']:.1f} ms, cached {compile_ms['cached_ms']:.3f} ms")
    print("concurrency  decode batch  mask/step ms  guided TPOT ms  share  unguided TPOT ms  CPU ms/token g/u"
          "  acceptance g/u")
    for r in report["runs"]:
        acceptance = " / ".join("-" if a is None else f"{a:.2f}" for a in (r["guided_acceptance"],
                                                                           r["unguided_acceptance"]))
        print(f"{r['concurrency']:>11}  {r['mean_decode_batch']:>12.1f}  {r['mask_ms_per_step']:>12.3f}  "
              f"{r['guided_tpot_ms']:>14.2f}  {100 * r['mask_share_of_tpot']:>4.1f}%  {r['unguided_tpot_ms']:>16.2f}  "
              f"{r['guided_cpu_ms_per_token']:.2f} / {r['unguided_cpu_ms_per_token']:.2f}  {acceptance:>14}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
