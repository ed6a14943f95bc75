"""Measure the pipeline bubble: N stages, flush (GPipe) with m = 1, 2, 4 and overlap with m = 2, 4, decoding.

    python -m engine.tools.pipeline_bubbles [--model random-llama-20m] [--requests 32] [--max-tokens 48]

For each setting it builds an engine with `pipeline_parallel_size=N`, warms it up, runs `requests`
prompts of `prompt-len` tokens for `max-tokens` greedy tokens each, and prints, from the engine's
own figures (docs/pipeline-parallelism.md):
- measured bubble: the stages' idle share of the time work was in flight (whole run);
- steady bubble: the same from the timeline, over the middle half of the run (no fill, no drain,
  no prefill ramp): what the overlap schedule should bring towards zero once m >= N;
- textbook: (N-1)/(m+N-1), GPipe's forward bubble for m equal micro-batches and free hand-overs;
- per stage busy / idle seconds, bytes sent between stages, and output tokens/s beside one stage's.
On a machine with fewer cores than stages + 1 the stages and the engine take turns on the cores, so
no speedup is expected; a stage's busy time then includes time it was runnable but not running,
which makes the measured bubble look smaller than the machine's idle time.
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.host import cpu_cores
from engine.pipeline_stats import window_bubble
from engine.sampling_params import SamplingParams
from engine.tools.bench import resolve_bench_model

SETTINGS = [("flush", 1), ("flush", 2), ("flush", 4), ("overlap", 2), ("overlap", 4)]


def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (length,), generator=generator).tolist() for _ in range(count)]


def run(config: EngineConfig, args) -> dict:
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    with Engine(config) as engine:
        vocab = engine.info.vocab_size
        engine.generate(prompts(args.requests, args.prompt_len, vocab, 1), SamplingParams(max_tokens=4,
                                                                                         ignore_eos=True))
        before = engine.stats().pipeline
        started = time.perf_counter()
        outputs = engine.generate(prompts(args.requests, args.prompt_len, vocab, 2), params)
        seconds = time.perf_counter() - started
        stats = engine.stats()
    tokens = sum(len(output.token_ids) for output in outputs)
    result = {"tokens_per_second": tokens / seconds}
    if before is None:
        return result
    figures = stats.pipeline.since(before)
    spans = [span for span in stats.pipeline.timeline if span.micro_batch >= before.micro_batches_run]
    first, last = min(span.start for span in spans), max(span.end for span in spans)
    quarter = (last - first) / 4
    result.update(figures=figures, steady=window_bubble(spans, figures.stages, first + quarter, last - quarter))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random-llama-20m")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--engine-threads", type=int, default=1,
                        help="torch threads of this (the engine's) process during the pipelined runs")
    args = parser.parse_args(argv)
    base = EngineConfig(model=resolve_bench_model(args.model), dtype="float32", max_num_seqs=args.requests,
                        prefix_caching=False)
    print(f"{args.model}, {args.stages} stages, {args.requests} requests x {args.max_tokens} tokens (prompts of "
          f"{args.prompt_len}), {cpu_cores()} CPU cores, torch threads: engine {args.engine_threads} with stages, "
          f"{max(1, torch.get_num_threads() // args.stages)} per stage")
    one = run(base, args)
    print(f"one stage: {one['tokens_per_second']:.0f} tokens/s ({torch.get_num_threads()} torch threads)")
    # With stages, this process only schedules and samples: one thread, so that a small reduction (the greedy argmax
    # over a micro-batch's logits) does not wait for a second core that a stage is using (11 ms instead of 0.1).
    torch.set_num_threads(args.engine_threads)
    one_thread = run(base, args)
    print(f"one stage: {one_thread['tokens_per_second']:.0f} tokens/s ({args.engine_threads} torch thread(s), as each "
          "stage has)")
    header = (f"{'schedule':<9}{'m':>3}{'textbook':>10}{'measured':>10}{'steady':>8}{'busy s (per stage)':>22}"
              f"{'idle s (per stage)':>22}{'MB sent':>9}{'tok/s':>7}")
    print(header)
    for schedule, micro_batches in SETTINGS:
        config = base.replace(pipeline_parallel_size=args.stages, pipeline_schedule=schedule,
                              pipeline_micro_batches=micro_batches)
        result = run(config, args)
        figures = result["figures"]
        steady = format(result["steady"], ".1%") if schedule == "overlap" else "-"
        busy = " ".join(f"{value:.2f}" for value in figures.stage_busy_seconds)
        idle = " ".join(f"{value:.2f}" for value in figures.stage_idle_seconds)
        print(f"{schedule:<9}{micro_batches:>3}{figures.textbook_bubble_share:>10.1%}{figures.bubble_share:>10.1%}"
              f"{steady:>8}{busy:>22}{idle:>22}{figures.bytes_between_stages / 1e6:>9.2f}"
              f"{result['tokens_per_second']:>7.0f}")
    print("measured: idle / (busy + idle) of the stages while micro-batches were in flight; steady: the same over "
          "the middle half of the run (overlap only: flush is idle between steps by design); textbook: (N-1)/(m+N-1).")
    if cpu_cores() < args.stages + 1:
        print(f"On {cpu_cores()} cores the {args.stages} stages and the engine's process share the cores: stages take "
              "turns rather than overlap, so pipelining adds hand-overs and no speed; busy time includes waiting for "
              "a core.")


if __name__ == "__main__":
    main()
