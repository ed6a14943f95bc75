"""Benchmark workloads: which prompts, how many tokens each asks for, and when each arrives.

Everything is drawn from one seeded `random.Random`, so the same arguments give the same requests
(the `--compare` run and a rerun next week see identical work). Random prompts are token ids, so
they need no tokenizer; a shared prefix is the same ids at the head of every prompt, which is what
prefix caching can reuse.

A workload can carry a second class of requests, a surge (`SurgeSpec`): long prompts sent into the middle of
the run, once the workload's own requests (the chat users) are well into their answers. That point is set in
tokens, not seconds, so that it falls at the same place in the chat users' answers on any device and under any
configuration; the surge is drawn after the chat requests, from the same generator, so the chat requests are
the same with or without it (the bench runs them alone too, as the surge's reference).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path

from engine.errors import ConfigError
from engine.hub import PROJECT_ROOT, list_models
from engine.presets import PRESETS_DIR

CHAT_PROMPTS_FILE = PRESETS_DIR / "chat_prompts.jsonl"
CHAT, SURGE = "chat", "surge"  # the request classes: the workload's own requests, and a surge's long prompts


def resolve_dataset(dataset: str, model: str | None) -> str:
    """The prompt file `chat` means for `model`: the questions presets/models.toml says suit it (a model taught
    one subject, like the demo model's standard library, is asked about that subject), else the general set."""
    if dataset != "chat" or model is None:
        return dataset
    entry = list_models().get(model)
    if entry is None or not entry.chat_prompts:
        return dataset
    return (PROJECT_ROOT / entry.chat_prompts).as_posix()


@dataclass(frozen=True)
class SurgeSpec:
    """A burst of `count` random prompts of `input_len` tokens, asking `output_len` tokens each: released once the
    chat requests have streamed `after_tokens` tokens each on average (`after_tokens` x their number, in all), then
    arriving at `request_rate` per second (Poisson; all at once when infinite)."""

    count: int
    input_len: int
    output_len: int
    after_tokens: int
    request_rate: float = math.inf

    def __post_init__(self):
        if min(self.count, self.input_len, self.output_len) < 1 or self.after_tokens < 0:
            raise ConfigError(f"a surge needs count, input_len and output_len >= 1 and after_tokens >= 0, got {self}")


@dataclass(frozen=True)
class WorkloadSpec:
    """What to send: the dataset, the sizes and the arrival process."""

    dataset: str = "random"
    num_prompts: int = 64
    input_len: int = 128
    output_len: int = 128
    output_len_range: tuple[int, int] | None = None
    input_len_range: tuple[int, int] | None = None
    prefix_len: int = 0
    request_rate: float = math.inf
    seed: int = 0
    surge: SurgeSpec | None = None


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload: its prompt, its output budget, its arrival offset in seconds and its class.

    With `after_tokens`, the request is held until the workload's requests without it have streamed that many
    tokens in all (or have all finished), and `arrival` counts from then rather than from the start of the run.
    """

    prompt: list[int] | str | list[dict]
    max_tokens: int
    arrival: float
    label: str = CHAT
    after_tokens: int = 0


def random_token_prompts(rng: random.Random, vocab_size: int, num_prompts: int, input_len: int,
                         prefix_len: int, input_len_range: tuple[int, int] | None = None) -> list[list[int]]:
    """`prefix_len` shared ids followed by ids unique to each prompt: `input_len` of them, or a number drawn
    uniformly from `input_len_range` for each prompt."""
    prefix = [rng.randrange(vocab_size) for _ in range(prefix_len)]
    lengths = [rng.randint(*input_len_range) for _ in range(num_prompts)] if input_len_range else \
        [input_len] * num_prompts
    return [prefix + [rng.randrange(vocab_size) for _ in range(length)] for length in lengths]


def read_jsonl_prompts(path: Path) -> list[str | list[dict]]:
    """Prompts from a .jsonl file: one {"prompt": str} or {"messages": [...]} object per line."""
    if not path.is_file():
        raise ConfigError(f"no prompt file at {path}")
    prompts: list[str | list[dict]] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}:{number}: not JSON ({error})") from error
        if isinstance(item, dict) and isinstance(item.get("prompt"), str):
            prompts.append(item["prompt"])
        elif isinstance(item, dict) and isinstance(item.get("messages"), list):
            prompts.append(item["messages"])
        else:
            raise ConfigError(f"{path}:{number}: expected an object with 'prompt' (text) or 'messages' (a list)")
    if not prompts:
        raise ConfigError(f"{path} holds no prompts")
    return prompts


def arrival_offsets(rng: random.Random, count: int, request_rate: float) -> list[float]:
    """Poisson arrivals (exponential gaps) at `request_rate` per second; all at once when it is infinite."""
    if math.isinf(request_rate):
        return [0.0] * count
    if request_rate <= 0:
        raise ConfigError(f"request_rate must be positive (or inf), got {request_rate}")
    offsets, now = [], 0.0
    for _ in range(count):
        offsets.append(now)
        now += rng.expovariate(request_rate)
    return offsets


def build_workload(spec: WorkloadSpec, vocab_size: int) -> list[BenchRequest]:
    """The requests of a workload, deterministic in `spec.seed`."""
    rng = random.Random(spec.seed)
    if spec.dataset == "random":
        prompts = random_token_prompts(rng, vocab_size, spec.num_prompts, spec.input_len, spec.prefix_len,
                                       spec.input_len_range)
    else:
        path = CHAT_PROMPTS_FILE if spec.dataset == "chat" else Path(spec.dataset)
        pool = read_jsonl_prompts(path)
        prompts = [pool[i % len(pool)] for i in range(spec.num_prompts)]
    if spec.output_len_range:
        low, high = spec.output_len_range
        lengths = [rng.randint(low, high) for _ in prompts]
    else:
        lengths = [spec.output_len] * len(prompts)
    offsets = arrival_offsets(rng, len(prompts), spec.request_rate)
    requests = [BenchRequest(p, n, t) for p, n, t in zip(prompts, lengths, offsets, strict=True)]
    if spec.surge:
        requests += surge_requests(rng, spec.surge, vocab_size, spec.surge.after_tokens * len(requests))
    return requests


def surge_requests(rng: random.Random, surge: SurgeSpec, vocab_size: int, after_tokens: int) -> list[BenchRequest]:
    """The surge's requests, each held until the chat requests have streamed `after_tokens` tokens in all."""
    prompts = random_token_prompts(rng, vocab_size, surge.count, surge.input_len, 0)
    offsets = arrival_offsets(rng, surge.count, surge.request_rate)
    return [BenchRequest(p, surge.output_len, t, SURGE, after_tokens) for p, t in zip(prompts, offsets, strict=True)]


def warmup_workload(spec: WorkloadSpec, vocab_size: int, count: int = 2, max_tokens: int = 4) -> list[BenchRequest]:
    """A few short requests of the same prompt size, sharing nothing with the measured ones (no cache hits); with a
    surge, one more of the surge's prompt size, so that the first long prefill measured is not the first ever."""
    rng = random.Random(spec.seed + 1_000_003)
    if spec.dataset != "random":
        prompts = [r.prompt for r in build_workload(replace(spec, surge=None), vocab_size)[:count]]
    else:
        input_len = spec.input_len_range[1] if spec.input_len_range else spec.input_len
        prompts = random_token_prompts(rng, vocab_size, count, input_len + spec.prefix_len, 0)
    if spec.surge:
        prompts += random_token_prompts(rng, vocab_size, 1, spec.surge.input_len, 0)
    return [BenchRequest(p, max_tokens, 0.0) for p in prompts]
