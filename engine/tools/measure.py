"""Measuring a workload on a loaded engine: send its requests, then summarize what came back.

Why apart from the CLI: `python -m engine.bench`, the precision table and the playground's Compare
and Benchmark tabs must measure the same way (the same submission from a pool of threads, the same
figures, the same report keys), so they share this code. A run can be cancelled (requests not yet
sent are never sent, those in flight are cancelled, and `send` returns only once every request it
sent has finished), and reports each finished request as it ends, for a progress bar.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict

import torch

from engine.core.metrics import describe_device, summarize
from engine.core.request import RequestOutput
from engine.hub import PROJECT_ROOT
from engine.info import EngineStats
from engine.sampling_params import GuidedDecoding, SamplingParams
from engine.tools.roofline import roofline_figures
from engine.tools.surge import class_figures
from engine.tools.workloads import SURGE, BenchRequest, WorkloadSpec, build_workload, warmup_workload

SPEC_COUNTERS = ("spec_num_drafts", "spec_num_draft_tokens", "spec_num_accepted_tokens")
CANCEL_POLL_S = 0.05


def _sampling(request: BenchRequest, index: int, temperature: float, ignore_eos: bool, seed: int, top_p: float,
              top_k: int, guided: GuidedDecoding | None = None) -> SamplingParams:
    return SamplingParams(max_tokens=request.max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                          ignore_eos=ignore_eos, seed=seed + index if temperature > 0 else None, guided=guided)


class _TokenGate:
    """Holds the requests that wait for others' tokens (`BenchRequest.after_tokens`, a surge's long prompts) until
    the requests without a wait (the sources) have streamed that many tokens in all, or have all ended: a gate
    never holds a run forever."""

    def __init__(self, sources: int):
        self._condition = threading.Condition()
        self._streamed = 0
        self._sources = sources

    def stream(self, handle) -> RequestOutput:
        """A source's output, its tokens counted as they stream."""
        for delta in handle:
            with self._condition:
                self._streamed += len(delta.token_ids)
                self._condition.notify_all()
        return handle.result()

    def source_ended(self) -> None:
        with self._condition:
            self._sources -= 1
            self._condition.notify_all()

    def wait(self, tokens: int, stop: threading.Event) -> float:
        """Block until `tokens` have streamed (or every source ended, or `stop` is set); the time it opened."""
        with self._condition:
            while self._streamed < tokens and self._sources > 0 and not stop.is_set():
                self._condition.wait(CANCEL_POLL_S)
        return time.perf_counter()


def send(engine, requests: list[BenchRequest], concurrency: int, temperature: float, ignore_eos: bool, seed: int,
         *, top_p: float = 1.0, top_k: int = 0, cancel: threading.Event | None = None,
         on_output: Callable[[int, RequestOutput], None] | None = None,
         on_submit: Callable[[int, float], None] | None = None,
         guided: GuidedDecoding | None = None) -> tuple[list, float]:
    """Submit every request (at most `concurrency` in flight, each not before its arrival offset).

    Request i samples with seed `seed + i` when the temperature is above 0, so two configurations given
    the same arguments draw from the same seeds. Returns the outputs in request order and the duration
    from the first submission to the last completion. Once `cancel` is set, nothing more is sent and
    the requests in flight are cancelled; an unsent request's output is None. `on_submit(index, sent)`
    (`time.perf_counter()` just before `Engine.submit`) and `on_output(index, output)` are called on a
    worker thread as each request is submitted and as it finishes. A request with `after_tokens` waits
    for the others' streamed tokens (`_TokenGate`), then for its `arrival` offset; such requests queue
    behind all the others, so they never hold the threads the others need.
    """
    outputs: list = [None] * len(requests)
    submitted: list[float] = []
    completed: list[float] = []
    in_flight: dict[int, object] = {}
    lock = threading.Lock()
    stop = cancel or threading.Event()
    gate = _TokenGate(sum(not request.after_tokens for request in requests)) \
        if any(request.after_tokens for request in requests) else None
    start = time.perf_counter()

    def run(index: int) -> None:
        request = requests[index]
        source = gate is not None and not request.after_tokens
        try:
            opened = gate.wait(request.after_tokens, stop) if request.after_tokens else start
            delay = opened + request.arrival - time.perf_counter()
            if (delay > 0 and stop.wait(delay)) or stop.is_set():
                return
            params = _sampling(request, index, temperature, ignore_eos, seed, top_p, top_k, guided)
            sent = time.perf_counter()
            handle = engine.submit(request.prompt, params)
            with lock:
                submitted.append(sent)
                in_flight[index] = handle
                late = stop.is_set()  # cancelled while submitting: the canceller did not see this handle
            if late:
                handle.cancel()
            if on_submit is not None:
                on_submit(index, sent)
            output = gate.stream(handle) if source else handle.result()
        finally:
            if source:
                gate.source_ended()
        with lock:
            completed.append(time.perf_counter())
            del in_flight[index]
        outputs[index] = output
        if on_output is not None:
            on_output(index, output)

    order = sorted(range(len(requests)), key=lambda i: bool(requests[i].after_tokens))  # stable: sources first
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(requests)))) as pool:
        pending = {pool.submit(run, i) for i in order}
        cancelled = False
        while pending:
            done, pending = wait(pending, timeout=CANCEL_POLL_S if cancel else None, return_when=FIRST_COMPLETED)
            for future in done:
                future.result()
            if stop.is_set() and not cancelled:
                cancelled = True
                with lock:
                    handles = list(in_flight.values())
                for handle in handles:
                    handle.cancel()
    return outputs, (max(completed) - min(submitted)) if submitted else 0.0


def speculative_figures(before: EngineStats, after: EngineStats, speculative: bool) -> dict:
    """Acceptance over the measured requests only (the warm-up's verifications subtracted).

    `spec_acceptance_rate` is accepted / proposed (docs/metrics.md); with speculation on, vLLM's bench names
    follow: its acceptance rate in percent, the acceptance length (1 + accepted per verification step,
    the bonus token counted), the counters, and for each proposal position the share of verification
    steps that accepted it. `spec_mean_accepted_tokens` is the acceptance length without the bonus token.
    """
    drafts, proposed, accepted = (getattr(after, key) - getattr(before, key) for key in SPEC_COUNTERS)
    figures = {"spec_acceptance_rate": accepted / proposed if proposed else 0.0}
    if not speculative:
        return figures
    per_position = [a - b for a, b in zip(after.spec_accepted_per_position, before.spec_accepted_per_position,
                                          strict=True)]
    figures.update({
        "spec_decode_acceptance_rate": 100.0 * figures["spec_acceptance_rate"],
        "spec_decode_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
        "spec_decode_num_drafts": drafts,
        "spec_decode_draft_tokens": proposed,
        "spec_decode_accepted_tokens": accepted,
        "spec_decode_per_position_acceptance_rates": [count / drafts if drafts else 0.0 for count in per_position],
        "spec_mean_accepted_tokens": accepted / drafts if drafts else 0.0,
    })
    return figures


def _step_time_split(before: EngineStats, after: EngineStats) -> dict:
    """Seconds of model steps during the measured run, and the share rank 0 spent in collectives."""
    executor = after.executor_seconds - before.executor_seconds
    collective = after.collective_seconds - before.collective_seconds
    return {"executor_seconds": executor, "collective_seconds": collective,
            "collective_share": collective / executor if executor else 0.0}


def served_figures(outputs: list, ignore_eos: bool) -> dict:
    """What a server was seen not to honour over a run's outputs (a served model's outputs carry `ignored`; an
    in-process engine's honour everything), one example of each, and whether a fixed-length workload stayed
    fixed-length (a server that ignores `ignore_eos` stops at end-of-sequence)."""
    ignored = {name: seen for output in outputs for name, seen in getattr(output, "ignored", {}).items()}
    return {"ignored_parameters": ignored, "fixed_length": ignore_eos and "ignore_eos" not in ignored}


def measure_engine(engine, spec: WorkloadSpec, concurrency: int, temperature: float, ignore_eos: bool,
                   warmup: bool = True, perplexity: bool = False, profile: bool = False, *,
                   requests: list[BenchRequest] | None = None, top_p: float = 1.0, top_k: int = 0,
                   goodput_slos: dict[str, float] | None = None, cancel: threading.Event | None = None,
                   on_output: Callable[[int, RequestOutput], None] | None = None, roofline: bool = False,
                   guided: GuidedDecoding | None = None) -> dict:
    """Warm `engine` up, run the workload on it, and return metrics, engine figures and its config.

    The requests are `build_workload(spec)` unless given. With `perplexity`, the held-out perplexity of
    the configuration is measured after the workload; with `profile`, the run's decode steps are set
    against their matmul floor (`Engine.decode_profile`). `goodput_slos` (ms per metric) adds vLLM's
    `request_goodput`. A cancelled run (`cancel` set) summarizes the requests that finished before it;
    `cancelled_requests` counts the others. With `roofline`, the run's prefill and decode steps are placed
    against the device's ceilings (`engine.tools.roofline.roofline_figures`). With `guided`, every request of the
    workload (not the warm-up) decodes under that structured-output grammar. A workload with a surge adds each
    request class's figures and the chat users' gaps split by the surge (`engine.tools.surge.class_figures`).
    """
    vocab = engine.info.vocab_size
    if warmup:
        send(engine, warmup_workload(spec, vocab), concurrency, temperature, ignore_eos, spec.seed,
             top_p=top_p, top_k=top_k, cancel=cancel)
    before = engine.stats()
    requests = build_workload(spec, vocab) if requests is None else requests
    sent_at: list[float | None] = [None] * len(requests)
    started, cpu_started = time.perf_counter(), time.process_time()
    outputs, duration = send(engine, requests, concurrency, temperature, ignore_eos, spec.seed, top_p=top_p,
                             top_k=top_k, cancel=cancel, on_output=on_output, on_submit=sent_at.__setitem__,
                             guided=guided)
    cpu_seconds = time.process_time() - cpu_started
    decode_profile = engine.decode_profile(since=started) if profile else None
    placed = roofline_figures(engine, started) if roofline else {}
    quality = engine.perplexity() if perplexity else None
    stats = engine.stats()
    info = engine.info
    resolved = engine.config.to_dict()
    finished = [o for o in outputs if o is not None and o.finish_reason != "cancelled"]
    errors = [o.error for o in finished if o.finish_reason == "error"]
    metrics = [o.metrics for o in finished]
    result = summarize(metrics, duration, goodput_slos)
    prompt_tokens = sum(m.prompt_tokens for m in metrics)
    result.update({
        "decode_profile": asdict(decode_profile) if decode_profile else None,
        "decode_profile_text": decode_profile.format() if decode_profile else None,
        "num_prompts": len(requests),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "cancelled_requests": len(requests) - len(finished),
        "prefix_cache_hit_rate": sum(m.cached_tokens for m in metrics) / prompt_tokens if prompt_tokens else 0.0,
        **speculative_figures(before, stats, resolved["speculative"] != "off"),
        # CPU time of the whole process over the measured run: on a shared machine it moves far less than wall
        # time with other people's load (it still includes their effect on caches).
        "process_cpu_seconds": cpu_seconds,
        "cpu_ms_per_output_token": 1000.0 * cpu_seconds / result["total_output_tokens"]
        if result["total_output_tokens"] else 0.0,
        # the measured run's own: an engine that served other work before (the playground's pool) has larger totals
        "peak_running": max((step.num_running for step in engine.step_history(since=started)),
                            default=stats.peak_running),
        "num_preemptions": stats.num_preemptions - before.num_preemptions,
        "weights_bytes": stats.weights_bytes,
        "kv_cache_bytes": stats.kv_cache_bytes,
        "peak_memory_bytes": stats.peak_memory_bytes,
        "tensor_parallel_size": stats.tensor_parallel_size,
        "rank_weights_bytes": list(stats.rank_weights_bytes),
        "rank_kv_cache_bytes": list(stats.rank_kv_cache_bytes),
        **_step_time_split(before, stats),
        "backend": info.backend, "attention": info.attention, "dtype": info.dtype,
        "device": info.device, "num_params": info.num_params, "notices": list(info.notices),
        "draft_model": info.draft_model,
        "config": resolved,
        "quantization": info.quantization, "num_kv_heads": info.num_kv_heads,
        "kv_bytes_per_token": info.kv_bytes_per_token,
        **served_figures(finished, ignore_eos),
        **placed,
    })
    if any(request.label == SURGE for request in requests):
        result.update(class_figures(requests, outputs, sent_at, goodput_slos))
    if quality is not None:
        result.update({"perplexity": quality.perplexity, "perplexity_tokens": quality.tokens,
                       "perplexity_seconds": quality.seconds, "perplexity_text": quality.source})
    return result


def source_revision() -> str | None:
    """The git commit the engine code comes from ("+dirty" when engine/ has local changes), if known."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                                text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "engine"],
                               cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def bench_report(result: dict, spec: WorkloadSpec, concurrency: int, temperature: float, ignore_eos: bool,
                 preset: str | None, goodput_slos: dict[str, float] | None = None) -> dict:
    """One configuration's result as `python -m engine.bench --json` writes it: the result, the workload that
    produced it (an infinite request rate, its own or its surge's, written as the string "inf"), the device and
    the source revision."""
    workload = {**asdict(spec), "concurrency": concurrency, "temperature": temperature, "ignore_eos": ignore_eos,
                "goodput_slos": dict(goodput_slos or {})}
    for arrivals in filter(None, (workload, workload["surge"])):
        if arrivals["request_rate"] == float("inf"):
            arrivals["request_rate"] = "inf"
    return {**result, "preset": preset, "workload": workload, "device_name": describe_device(),
            "torch_threads": torch.get_num_threads(), "source_revision": source_revision()}


def agreement(expected: list[list[int]], got: list[list[int]]) -> dict:
    """Exact sequences, and the share of tokens generated before each sequence first diverges."""
    total = sum(len(e) for e in expected)
    prefix = 0
    for e, g in zip(expected, got, strict=True):
        for a, b in zip(e, g, strict=False):
            if a != b:
                break
            prefix += 1
    exact = sum(e == g for e, g in zip(expected, got, strict=True))
    return {"exact_sequences": exact, "sequences": len(expected), "agreeing_token_fraction": prefix / total}
