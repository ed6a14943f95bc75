"""`python -m engine.first_reply`: is a loaded level's first reply as fast as the next ones, and what does Apply cost?

For each quantization level, `--applies` times: load a fresh engine (what the playground's Apply does;
its time and the warm-up's share of it are reported), then ask `--replies` chat questions one at a
time, the model's own example questions in turn. The first reply of each load is compared with the
replies after it: median engine TTFT and median decode speed of the first replies over the loads,
against the median over every later reply, as "first / next" ratios (TTFT: above 1 means the first
is slower; decode: below 1 means the first is slower).

    python -m engine.first_reply --model demo --quantization int8 nf4 --applies 3 --replies 5
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.hub import list_models
from engine.sampling_params import SamplingParams

FALLBACK_QUESTION = "What does a KV cache store?"


def questions(model: str) -> list[str]:
    """The model's curated example questions (a fallback for models without any)."""
    entry = list_models().get(model)
    return list(entry.examples) if entry and entry.examples else [FALLBACK_QUESTION]


def reply_figures(engine: Engine, question: str, max_tokens: int) -> dict:
    """One chat reply, alone in the engine: its engine TTFT (ms) and decode speed (tokens/s after the first)."""
    output = engine.generate([[{"role": "user", "content": question}]],
                             SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0]
    metrics = output.metrics
    return {"ttft_ms": metrics.ttft * 1000, "decode_tokens_per_s": 1 / metrics.tpot if metrics.tpot else None}


def measure_level(config: EngineConfig, applies: int, replies: int, max_tokens: int, pause_s: float) -> dict:
    """`applies` fresh loads of `config`, each followed by `replies` replies `pause_s` apart (a person's pace: the
    engine's idle loop thread has ended by then, as between a playground Apply and its first reply): per load,
    Apply's time, its warm-up and every reply's figures; then the first-versus-next medians."""
    asked = questions(config.model)
    loads = []
    for _ in range(applies):
        started = time.perf_counter()
        engine = Engine(config)
        apply_s = time.perf_counter() - started
        try:
            figures = []
            for i in range(replies):
                time.sleep(pause_s)
                figures.append(reply_figures(engine, asked[i % len(asked)], max_tokens))
        finally:
            engine.close()
            gc.collect()
        loads.append({"apply_s": apply_s, "warmup_s": engine.info.warmup_seconds, "replies": figures})
    summary = {"quantization": config.quantization, "loads": loads,
               "median_apply_s": statistics.median(load["apply_s"] for load in loads),
               "median_warmup_s": statistics.median(load["warmup_s"] for load in loads)}
    for key in ("ttft_ms", "decode_tokens_per_s"):
        first = statistics.median(load["replies"][0][key] for load in loads)
        later = statistics.median(reply[key] for load in loads for reply in load["replies"][1:])
        summary[key] = {"first": first, "next": later, "first_over_next": first / later}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--quantization", nargs="+", default=["int8", "nf4"])
    parser.add_argument("--applies", type=int, default=3)
    parser.add_argument("--replies", type=int, default=5, help="replies per load, the first included")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--pause", type=float, default=1.0, help="seconds before each reply")
    parser.add_argument("--threads", type=int, help="torch CPU threads (1 keeps a shared machine's load from "
                                                     "stalling a parallel region)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.applies < 1 or args.replies < 2:
        parser.error("need at least one apply and two replies (a first and a next)")
    results = []
    for level in args.quantization:
        result = measure_level(EngineConfig(model=args.model, quantization=level), args.applies, args.replies,
                               args.max_tokens, args.pause)
        results.append(result)
        ttft, decode = result["ttft_ms"], result["decode_tokens_per_s"]
        print(f"{level}: Apply {result['median_apply_s']:.2f} s (warm-up {result['median_warmup_s']:.2f} s) · "
              f"TTFT first {ttft['first']:.1f} ms, next {ttft['next']:.1f} ms ({ttft['first_over_next']:.2f}x) · "
              f"decode first {decode['first']:.1f} tok/s, next {decode['next']:.1f} tok/s "
              f"({decode['first_over_next']:.2f}x)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
