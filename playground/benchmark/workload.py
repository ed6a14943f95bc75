"""A benchmark's workload as asked for: the bench's own knobs (`engine.WorkloadSpec`), parsed strictly and held
to the hosting caps (PLAYGROUND_MAX_BENCH_*, the prompt and token caps).

Why a module: the tab's knobs and `/benchmark` reach the server with any JSON value; a workload is refused
here, with one clear message naming the knob or the cap, before anything is sent to an engine.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from engine import WorkloadSpec
from playground.shared.chat_messages import MAX_MESSAGES, parse_messages
from playground.shared.errors import Refused
from playground.shared.settings import Settings
from playground.shared.surge import parse_surge
from playground.shared.values import parse_int, parse_real

DATASETS = ("random", "chat", "upload")
MAX_UPLOAD_BYTES = 1024 * 1024
MAX_RATE = 1000.0
MAX_OBJECTIVE_MS = 1e9


@dataclass(frozen=True)
class BenchmarkRequest:
    """A benchmark as asked for, parsed and within the hosting caps."""

    spec: WorkloadSpec
    concurrency: int
    ignore_eos: bool
    goodput_slos: dict


def parse_length(name: str, value, maximum: int) -> tuple[int, tuple[int, int] | None]:
    """A length written N or LO:HI (a length drawn per request): (N or HI, the range or None)."""
    text = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else None
    if text is None:
        raise Refused(f"{name} must be a number of tokens, or LO:HI")
    low, sep, high = text.partition(":")
    if not sep:
        return parse_int(name, low, 1, maximum), None
    low_value, high_value = parse_int(name, low, 1, maximum), parse_int(name, high, 1, maximum)
    if low_value > high_value:
        raise Refused(f"{name}: LO:HI needs LO <= HI, got {text}")
    return high_value, (low_value, high_value)


def _objective(name: str, value) -> float | None:
    if value is None or value == "":
        return None
    return parse_real(f"the {name} objective (ms, 0 = none)", value, 0.0, MAX_OBJECTIVE_MS) or None


def _rate(settings: Settings, value) -> float:
    """Requests per second (0: all at once), at least the server's minimum (public mode) when not 0."""
    rate = parse_real("request rate (per second, 0 = all at once)", 0.0 if value is None else value, 0.0, MAX_RATE)
    if 0 < rate < settings.min_bench_rate:
        raise Refused(f"request rate must be 0 (all at once) or at least {settings.min_bench_rate:g} per second on "
                      f"this server (PLAYGROUND_MIN_BENCH_RATE), got {rate:g}", "request_rate")
    return rate


def _upload_path(settings: Settings, upload) -> str:
    """The uploaded .jsonl, each of its prompts held to what the OpenAI routes take (text, or messages with their
    roles and sizes)."""
    if isinstance(upload, dict):  # an API call's file record (Gradio checked it lies in its upload cache)
        upload = upload.get("path")
    path = Path(upload) if isinstance(upload, str) and upload else None
    if path is None or not path.is_file():
        raise Refused("choose a .jsonl file to upload (one {\"prompt\": ...} or {\"messages\": [...]} per line)")
    if path.suffix.lower() != ".jsonl":
        raise Refused("the uploaded prompts must be a .jsonl file")
    if path.stat().st_size > MAX_UPLOAD_BYTES:
        raise Refused(f"the uploaded file is over {MAX_UPLOAD_BYTES // 1024} KiB")
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            raise Refused(f"line {number} of the uploaded file is not JSON") from None
        prompt = item.get("prompt") if isinstance(item, dict) else None
        if isinstance(prompt, str) and len(prompt) <= settings.max_message_chars:
            continue
        if not isinstance(item, dict) or "messages" not in item:
            raise Refused(f"line {number} of the uploaded file needs 'prompt' (text of at most "
                          f"{settings.max_message_chars:,} characters) or 'messages'")
        try:
            parse_messages(item["messages"], MAX_MESSAGES, settings.max_message_chars,
                           settings.max_conversation_chars)
        except Refused as refusal:
            raise Refused(f"line {number} of the uploaded file: {refusal}") from None
    return str(path)


def parse_workload(settings: Settings, dataset, upload, num_requests, concurrency, request_rate, input_tokens,
                   output_tokens, prefix_tokens, ignore_eos, slo_ttft_ms, slo_tpot_ms, seed,
                   surge="") -> BenchmarkRequest:
    """The workload asked for, or Refused naming the first bad value or the cap it exceeds."""
    if dataset not in DATASETS:
        raise Refused(f"dataset must be one of {', '.join(DATASETS)}")
    count = parse_int("requests", num_requests, 1, settings.max_bench_requests)
    in_flight = parse_int("concurrency", concurrency, 0, settings.max_bench_concurrency)
    rate = _rate(settings, request_rate)
    input_len, input_range = parse_length("input tokens", input_tokens, settings.max_prompt_tokens)
    output_len, output_range = parse_length("output tokens", output_tokens, settings.max_new_tokens)
    prefix = parse_int("shared prefix", prefix_tokens or 0, 0, settings.max_prompt_tokens)
    if not isinstance(ignore_eos, bool):
        raise Refused("ignore EOS must be true or false")
    if dataset == "random" and prefix + input_len > settings.max_prompt_tokens:
        raise Refused(f"shared prefix + input tokens = {prefix + input_len} is over this server's prompt cap of "
                      f"{settings.max_prompt_tokens} (PLAYGROUND_MAX_PROMPT_TOKENS)")
    burst = parse_surge(settings, surge, output_len)
    tokens = count * ((prefix + input_len if dataset == "random" else 0) + output_len)
    if burst is not None:
        if count + burst.count > settings.max_bench_requests:
            raise Refused(f"requests + surge count = {count + burst.count} is over this server's cap of "
                          f"{settings.max_bench_requests} (PLAYGROUND_MAX_BENCH_REQUESTS)")
        tokens += burst.count * (burst.input_len + burst.output_len)
    if tokens > settings.max_bench_tokens:
        raise Refused(f"this run asks for up to {tokens:,} tokens, over this server's cap of "
                      f"{settings.max_bench_tokens:,} (PLAYGROUND_MAX_BENCH_TOKENS)")
    slos = {name: limit for name, limit in (("ttft", _objective("TTFT", slo_ttft_ms)),
                                            ("tpot", _objective("TPOT", slo_tpot_ms))) if limit}
    spec = WorkloadSpec(dataset=_upload_path(settings, upload) if dataset == "upload" else dataset, num_prompts=count,
                        input_len=input_len if not input_range else input_range[0], input_len_range=input_range,
                        output_len=output_len, output_len_range=output_range,
                        prefix_len=prefix if dataset == "random" else 0,
                        request_rate=rate or math.inf, seed=parse_int("seed", seed or 0, 0, 2**31 - 1), surge=burst)
    everyone = count + (burst.count if burst else 0)
    return BenchmarkRequest(spec=spec, concurrency=min(in_flight or everyone, settings.max_bench_concurrency),
                            ignore_eos=ignore_eos, goodput_slos=slos)
