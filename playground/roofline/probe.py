"""The roofline's probe: a short, fixed workload that shows decode at several batch sizes.

Why: the steps a chat leaves behind are mostly one sequence at a time, and a roofline needs decode at
several batch sizes to show how arithmetic intensity grows with the batch. The probe sends one, then
several, then many sequences of random prompt tokens (a fixed seed: the same probe every time).
"""

from __future__ import annotations

import random
import time

from engine import SamplingParams

PROBE_BATCHES = (1, 4, 16)
PROBE_INPUT_LEN = 128
PROBE_OUTPUT_LEN = 32
PROBE_SEED = 0


def probe_prompts(count: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    """`count` prompts of `length` random token ids (a fixed seed: the same probe every time)."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(length)] for _ in range(count)]


def run_probe(engine) -> float:
    """The probe's requests, batch after batch, on `engine`; returns when it started (a perf_counter time)."""
    started = time.perf_counter()
    length = min(PROBE_INPUT_LEN, engine.info.max_model_len - PROBE_OUTPUT_LEN - 1)
    for index, batch in enumerate(PROBE_BATCHES):
        prompts = probe_prompts(batch, length, engine.info.vocab_size, PROBE_SEED + index)
        engine.generate(prompts, SamplingParams(max_tokens=PROBE_OUTPUT_LEN, ignore_eos=True))
    return started
