"""`Engine`: the public API. Callers on any thread submit requests; one loop thread batches them all.

Loading first makes the configuration's plan (`engine/plan.py`: every `auto` made concrete against
the checkpoint and this host), then builds the backend the plan chose (`engine/backends/`). The
engine turns prompts (text, token ids or chat messages) into token ids, validates them against the
context length, and hands them to that backend: the native one
(our model, scheduler and paged KV cache) or the `transformers` baseline. Both implement one
contract and are stepped by the same loop here, so requests, streaming, cancellation and
metrics behave the same on either. A failure while building the engine releases everything it
allocated; `close()` frees the model and KV cache and ends pending streams as "aborted", and an
engine still open when the interpreter exits is closed then.

`perplexity()` measures the loaded configuration's quality through the backend's own forward
pass (so quantization and GQA conversion show in it): its windows are scored by the same loop
thread, one per turn between serving steps, so requests keep being served meanwhile.
`next_token_log_probs()` hands the caller those same windows' full next-token distributions (to
compare two configurations position by position); perplexity is computed from them.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import torch

from engine.backends.base import Backend
from engine.config import EngineConfig
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.metrics import describe_device
from engine.core.perplexity import (
    DEFAULT_WINDOW,
    HELD_OUT_SOURCE,
    PerplexityResult,
    ScoredWindow,
    ScoringJob,
    held_out_texts,
    perplexity_of,
    token_stream,
    token_windows,
)
from engine.core.request import Request, RequestHandle, RequestOutput, StreamDelta, stream_of
from engine.core.threads import run_on_passing_thread, start_helper_thread
from engine.errors import ModelLoadError, RequestError
from engine.guided.grammars import CompiledGrammar, GrammarCompiler
from engine.hub import eos_token_ids, load_tokenizer
from engine.info import EngineInfo, EngineStats, StepRecord
from engine.plan import EnginePlan, plan_engine
from engine.prompts import PromptEncoder, check_text, encode_prompt, prompt_batch
from engine.runner.profiler import DecodeProfile
from engine.sampling_params import GuidedDecoding, SamplingParams

log = logging.getLogger(__name__)

Prompt = str | list[int] | list[dict]
STEP_HISTORY = 4096
# An idle loop thread ends after this long; the next piece of work starts another. A thread that ran torch's parallel
# CPU operators keeps an OpenMP pool while it lives, and with several engines loaded (the playground keeps a few),
# their idle loops' pools made libgomp park its threads between every parallel region of the one that works.
LOOP_IDLE_EXIT_SECONDS = 0.5
SEED_BITS = 62
WARM_UP_DECODE_STEPS = 8  # decode steps of the warm-up request (`Engine._warm_up`)
# Engines not closed yet. A script that ends without `close()` would otherwise leave an engine's threads running into
# the interpreter's shutdown, where tearing down a thread still inside torch aborted the process ("terminate called
# without an active exception", exit status 134).
_OPEN_ENGINES: weakref.WeakSet = weakref.WeakSet()
QUIET_TIMEOUT_SECONDS = LOOP_IDLE_EXIT_SECONDS + 1.5


def quiet_other_engines(engine: Engine, timeout: float = QUIET_TIMEOUT_SECONDS) -> None:
    """Wait for every other open engine's loop thread to end idle before `engine` is timed.

    A live thread that ran torch's parallel CPU operators keeps its OpenMP pool, and while another
    pool lives, libgomp stops spinning between parallel regions: measured on the 2-core machine, a
    batch-1 decode step of native-int8 random-llama-20m took 1.8 ms instead of 0.9 ms within half a
    second of another engine's last step. The precision table, which keeps every row's engine loaded,
    waits here before timing each row. A server does not: its engines serve other visitors, and a
    measurement that waited for them to go idle held its place for seconds (the soak's attacked
    round).
    """
    for other in list(_OPEN_ENGINES):
        if other is not engine:
            other.wait_idle(timeout)


@atexit.register
def _close_open_engines() -> None:
    for engine in list(_OPEN_ENGINES):
        engine.close()


def make_backend(plan: EnginePlan) -> Backend:
    """The backend the plan chose, loaded (weights, KV pool, worker processes)."""
    if plan.backend == "native" and plan.config.disaggregation != "off":
        from engine.backends.disaggregated import DisaggregatedBackend

        return DisaggregatedBackend(plan)
    overlapped_stages = plan.config.pipeline_parallel_size > 1 and plan.config.pipeline_schedule == "overlap"
    if plan.backend == "native" and overlapped_stages:
        from engine.backends.pipelined import PipelinedBackend

        return PipelinedBackend(plan)
    if plan.backend == "native":
        from engine.backends.native import NativeBackend

        return NativeBackend(plan)
    if plan.backend == "llama.cpp":
        from engine.backends.llama_cpp import LlamaCppBackend

        return LlamaCppBackend(plan)
    from engine.backends.hf import HFBackend

    return HFBackend(plan)


class Engine:
    """Loads a model, serves generate/stream calls from many threads through one batching loop."""

    def __init__(self, config: EngineConfig | None = None, **overrides):
        config = config or EngineConfig()
        started = time.perf_counter()
        self.plan = plan_engine(config.replace(**overrides) if overrides else config)
        self.config = self.plan.config
        self.tokenizer = load_tokenizer(self.plan.path)
        self._prompts = PromptEncoder(self.tokenizer) if self.tokenizer is not None else None
        notices = list(self.plan.notices)
        if self.tokenizer is None:
            notices.insert(0, "this model folder has no tokenizer: only token-id prompts work")
        plan = self.plan
        self._backend: Backend | None = run_on_passing_thread(lambda: make_backend(plan), "engine-load",
                                                              lambda backend: backend.close())
        self.eos_token_ids = eos_token_ids(plan.path, plan.hf_config, self.tokenizer)
        self._grammars = (GrammarCompiler(self.tokenizer, plan.vocab_size, self.eos_token_ids)
                          if self.tokenizer is not None else None)
        self._seeds = torch.Generator().manual_seed(self.config.seed)
        self._history: deque[StepRecord] = deque(maxlen=STEP_HISTORY)
        self._wakeup = threading.Condition()
        self._inbox: list[Request] = []
        self._loop_calls: list[tuple[Callable[[Backend], object], Future]] = []
        self._scoring_jobs: deque[ScoringJob] = deque()
        self._held_out_perplexity: PerplexityResult | None = None
        self._held_out_lock = threading.Lock()
        self._closed = False
        self._loop: threading.Thread | None = None
        _OPEN_ENGINES.add(self)
        with self._wakeup:
            self._wake_loop()
        warm_up_started = time.perf_counter()
        try:
            self._warm_up()
            self._forget_warm_up()
        except BaseException:
            self.close()
            raise
        self.info = EngineInfo(
            model=self.config.model, path=str(plan.path), architecture=plan.architecture, backend=plan.backend,
            device=plan.device, device_name=describe_device(), dtype=plan.dtype_name,
            kv_cache_dtype=plan.kv_dtype_name, attention=plan.attention, quantization=self.config.quantization,
            max_model_len=plan.max_model_len, vocab_size=plan.vocab_size,
            num_params=self._backend.num_params, num_kv_heads=plan.num_kv_heads,
            kv_bytes_per_token=plan.kv_bytes_per_token, cuda_graphs=plan.cuda_graphs, cpu_kernels=plan.cpu_kernels,
            tensor_parallel_size=self.config.tensor_parallel_size,
            draft_model=plan.draft.name if plan.draft else None, draft_num_params=self._backend.draft_num_params,
            load_seconds=time.perf_counter() - started, warmup_seconds=time.perf_counter() - warm_up_started,
            notices=tuple(notices))

    def _warm_up(self) -> None:
        """Run one request through the loaded level's real prefill and decode, so a broken setup fails here, not on
        a user, and the first reply does not pay the level's first calls (a library level's lazy set-up, its
        kernels' first use of a prefill-sized and a one-row input, attention over more than one KV block).

        The prompt spans two KV blocks and a bit, then a few decode steps follow; both shrink to fit a short
        context. Its token ids come from the top of the vocabulary, where a real prompt's first block hardly ever
        matches the blocks it leaves in the prefix cache; the engine's counters and step history forget it.
        `info.warmup_seconds` reports what this adds to a load.
        """
        max_len = self.config.max_model_len
        prompt_len = max(1, min(2 * self.config.block_size + 1, max_len // 2))
        decode_steps = max(1, min(WARM_UP_DECODE_STEPS, max_len - prompt_len - 1))
        prompt = [(self.plan.vocab_size - 1 - index) % self.plan.vocab_size for index in range(prompt_len)]
        output = self.generate([prompt], SamplingParams(max_tokens=decode_steps, ignore_eos=True))[0]
        if output.finish_reason != "length":
            raise ModelLoadError(f"the engine failed its warm-up request: {output.error or output.finish_reason}")

    def _forget_warm_up(self) -> None:
        """Counters and step history start after the warm-up: the engine's figures cover the requests it serves."""
        self._on_loop(lambda backend: backend.forget_warm_up())
        self._history.clear()

    # ---- prompts -------------------------------------------------------------------------------

    @property
    def renders_tools(self) -> bool:
        """Whether this model's chat template shows the model function tools itself (`encode(messages, tools)`)."""
        return self._prompts is not None and self._prompts.renders_tools

    def encode(self, prompt: Prompt, tools: list[dict] | None = None) -> list[int]:
        """Token ids of a prompt: text, token ids, or chat messages rendered with the chat template (with `tools`,
        OpenAI-style function tools, where the template renders them: see `renders_tools`). Text (a prompt, inside
        messages, or in the tools) never becomes a control token: only token ids and the template's own text can
        (`engine/prompts.py`).

        Raises RequestError for anything else, and for a prompt that leaves no room to generate.
        """
        if self._backend is None:
            raise RequestError("the engine is closed")
        return encode_prompt(self._prompts, prompt, tools, self.plan.vocab_size, self.config.max_model_len)

    def _make_request(self, prompt: Prompt, params: SamplingParams,
                      grammar: tuple[CompiledGrammar, bool] | None = None, first: bool = True) -> Request:
        """A request for one prompt; with a compiled grammar, its own copy of it (the compile is charged to the
        first request of a call that missed the cache)."""
        ids = self.encode(prompt)
        seed = params.seed
        if seed is None:
            seed = int(torch.randint(2**SEED_BITS, (1,), generator=self._seeds).item())
        request = Request(ids, params, self.eos_token_ids, self.config.max_model_len,
                          IncrementalDetokenizer(self.tokenizer, ids, params.stop), seed)
        if grammar is not None:
            compiled, cached = grammar
            request.grammar = compiled.new_request_grammar()
            request.guided_compile_s = compiled.compile_seconds if first and not cached else 0.0
        return request

    # ---- public API ----------------------------------------------------------------------------

    def submit(self, prompt: Prompt, params: SamplingParams | None = None) -> RequestHandle:
        """Queue one request; the handle streams its deltas, waits for its result or cancels it."""
        return self._submit_all([prompt], params)[0]

    def _submit_all(self, prompts: list[Prompt], params: SamplingParams | None) -> list[RequestHandle]:
        if params is not None and not isinstance(params, SamplingParams):
            raise RequestError(f"params must be SamplingParams, got {type(params).__name__}")
        params = (params or SamplingParams()).validate()
        if self.plan.backend == "hf" and params.logprobs is not None:
            raise RequestError("logprobs need the native backend (or llama.cpp's); this model is served through "
                               "transformers")
        grammar = self._compile_guided(params.guided) if params.guided is not None else None
        with self._wakeup:
            if self._closed:
                raise RequestError("the engine is closed")
            requests = [self._make_request(prompt, params, grammar, first=index == 0)
                        for index, prompt in enumerate(prompts)]
            self._inbox.extend(requests)
            self._wake_loop()
        return [RequestHandle(request, self._cancel_request(request)) for request in requests]

    def check_guided(self, guided: GuidedDecoding) -> None:
        """Compile `guided` (cached per spec for this engine's tokenizer) within the compile-time bound, so a caller
        can refuse a request before admitting it; RequestError naming an unsupported schema keyword, a bad regex or
        grammar, or a bound. `submit` does the same."""
        self._compile_guided(guided)

    def _compile_guided(self, guided: GuidedDecoding) -> tuple[CompiledGrammar, bool]:
        if not isinstance(guided, GuidedDecoding):
            raise RequestError(f"guided must be a GuidedDecoding, got {type(guided).__name__}")
        if self.plan.backend != "native":
            served_by = "llama.cpp" if self.plan.backend == "llama.cpp" else "transformers"
            raise RequestError(f"guided decoding needs the native backend; this model is served through {served_by}")
        if self._grammars is None:
            raise RequestError("guided decoding needs the model's tokenizer; this model folder has none")
        return self._grammars.compile(guided)

    def _cancel_request(self, request: Request):
        def cancel() -> None:
            request.cancel_requested = True
            with self._wakeup:  # a request not yet finished is the loop's work, so its loop thread is alive
                self._wakeup.notify()
        return cancel

    def generate(self, prompts, params: SamplingParams | None = None) -> list[RequestOutput]:
        """One output per prompt, in order. All prompts are validated before any is queued."""
        return [handle.result() for handle in self._submit_all(prompt_batch(prompts), params)]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[StreamDelta]:
        """Yield text deltas as they are produced; closing the generator early cancels the request."""
        return stream_of(lambda: self.submit(prompt, params))

    def stats(self) -> EngineStats:
        """Engine-level figures (docs/metrics.md); after `close()`, zeros with `closed` set."""
        with self._wakeup:
            backend = None if self._closed else self._backend
            return backend.stats() if backend is not None else EngineStats(closed=True)

    def decode_profile(self, since: float = 0.0) -> DecodeProfile | None:
        """Where the decode steps finished after `since` (a `time.perf_counter()` value) spent their time,
        against their matmul floor, which is measured now on the engine's loop thread between steps.

        None when there were no such steps, or when the backend does not profile them (transformers,
        or a GPU, whose asynchronous kernels wall-clock sections cannot time).
        """
        return self._on_loop(lambda backend: backend.decode_profile(since))

    def _on_loop(self, call: Callable[[Backend], object]):
        """Run `call(backend)` on the loop thread between two steps and return its result."""
        future: Future = Future()
        with self._wakeup:
            if self._closed:
                raise RequestError("the engine is closed")
            self._loop_calls.append((call, future))
            self._wake_loop()
        return future.result()

    def perplexity(self, texts: list[str] | None = None,
                   progress: Callable[[int, int], None] | None = None) -> PerplexityResult:
        """Perplexity of the loaded configuration on `texts`, or on the demo model's held-out text by default.

        Every token after the first of each text (texts are joined, each led by BOS) is predicted from up
        to 256 tokens of context, through this engine's own forward pass. The default figure is computed
        once per engine and cached. `progress(windows_done, windows_total)` is called in the caller's
        thread as windows complete. Requests are served meanwhile; a failure raises EngineError and
        leaves the engine serving.
        """
        if texts is None:
            with self._held_out_lock:
                if self._held_out_perplexity is None:
                    self._held_out_perplexity = self._perplexity(None, progress)
                return self._held_out_perplexity
        return self._perplexity(texts, progress)

    @property
    def held_out_perplexity(self) -> PerplexityResult | None:
        """The default perplexity once `perplexity()` has measured it on this engine (None before): what a
        dashboard shows without starting the measurement."""
        return self._held_out_perplexity

    def next_token_log_probs(self, texts: list[str] | None = None,
                             chunk_tokens: int | None = None) -> Iterator[ScoredWindow]:
        """The next-token log-probabilities over the whole vocabulary at every scored position of `texts` (or of
        the demo model's held-out text), window by window: the windows and forward pass `perplexity()` uses.

        `chunk_tokens` runs each window as steps of that many tokens over the cache the earlier steps wrote, as
        decode and chunked prefill do, instead of one prefill (the native backend's attention over the KV pool
        then scores what a generated token sees: with `kv_cache_dtype=int8`, its integer path).

        Each `ScoredWindow` holds its token ids and a [tokens - 1, vocab] float32 tensor; the engine scores the
        next window only once the caller has taken the last, so memory stays bounded by one or two windows.
        Scoring starts at the first `next()`; closing the iterator early stops it.
        """
        if chunk_tokens is not None and (not isinstance(chunk_tokens, int) or chunk_tokens < 1):
            raise RequestError(f"chunk_tokens must be a positive number of tokens, got {chunk_tokens!r}")
        return self._scored(self._scoring_job(texts, chunk_tokens))

    def _perplexity(self, texts: list[str] | None, progress: Callable[[int, int], None] | None) -> PerplexityResult:
        job = self._scoring_job(texts)
        return perplexity_of(self._scored(job), len(job.windows), job.source, progress)

    def _scoring_job(self, texts: list[str] | None, chunk_tokens: int | None = None) -> ScoringJob:
        """The windows of `texts` (None: the held-out text) as a job, validated before anything is queued."""
        if self.tokenizer is None:
            raise RequestError("this model has no tokenizer: scoring needs text")
        if texts is None:
            texts, source = held_out_texts(), HELD_OUT_SOURCE
        elif not isinstance(texts, list | tuple) or not texts or not all(isinstance(t, str) for t in texts):
            raise RequestError("pass a non-empty list of strings (or None for the held-out text)")
        else:
            source = f"{len(texts)} text(s) given by the caller"
        for index, text in enumerate(texts):
            check_text(text, f"text {index}")
        stream = token_stream([self.tokenizer.encode(text, add_special_tokens=False) for text in texts],
                              self.tokenizer.bos_token_id)
        window = min(DEFAULT_WINDOW, self.config.max_model_len - 1)
        return ScoringJob(token_windows(stream, window), source, self._wake_for_scoring, chunk_tokens)

    def _scored(self, job: ScoringJob) -> Iterator[ScoredWindow]:
        with self._wakeup:
            if self._closed:
                raise RequestError("the engine is closed")
            self._scoring_jobs.append(job)
            self._wake_loop()
        yield from job.results()

    def _wake_for_scoring(self) -> None:
        with self._wakeup:
            if not self._closed:
                self._wake_loop()

    def step_history(self, since: float = 0.0) -> list[StepRecord]:
        """The recent steps (oldest first) that ended after `since` (a `time.perf_counter()` value)."""
        return [step for step in list(self._history) if step.time > since]

    def close(self) -> None:
        """Stop the loop, end pending requests as "aborted", and free the model and KV cache."""
        with self._wakeup:
            if self._closed:
                return
            self._closed = True
            self._wake_loop()
            loop = self._loop
        _OPEN_ENGINES.discard(self)
        loop.join()
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the loop ------------------------------------------------------------------------------

    def _score_next_window(self, backend: Backend) -> None:
        """Score one window of the oldest scoring job whose caller has room for it (between two steps, so serving
        goes on); jobs that are finished leave the queue."""
        while self._scoring_jobs and self._scoring_jobs[0].finished:
            self._scoring_jobs.popleft()
        job = next((job for job in self._scoring_jobs if job.wants_window()), None)
        if job is None:
            return
        try:
            log_probs = backend.score(job.next_window(), job.chunk_tokens)
        except Exception as error:  # a failed measurement fails its caller only
            log.error("scoring a window failed:\n%s", traceback.format_exc())
            job.fail(f"{type(error).__name__}: {error}")
        else:
            if log_probs is not None:
                job.record(log_probs)
            elif not backend.has_work():
                job.fail("the KV cache cannot hold one scoring window")

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for this engine's loop thread to end idle (it does after
        `LOOP_IDLE_EXIT_SECONDS` without work); whether it has."""
        with self._wakeup:
            loop = self._loop
        if loop is not None:
            loop.join(timeout)
        return loop is None or not loop.is_alive()

    def _has_loop_work(self) -> bool:
        """Whether the loop has anything to do (called with `_wakeup` held)."""
        return bool(self._inbox or self._loop_calls or self._backend.has_work() or self._closed
                    or any(job.wants_window() for job in self._scoring_jobs))

    def _wake_loop(self) -> None:
        """Tell the loop there is work, starting a loop thread if the last one ended idle (`_wakeup` held)."""
        if self._loop is None or not self._loop.is_alive():
            self._loop = start_helper_thread(self._run_loop, "engine-loop")
        self._wakeup.notify()

    def _run_loop(self) -> None:
        backend = self._backend
        while True:
            with self._wakeup:
                while not self._has_loop_work():
                    if not self._wakeup.wait(LOOP_IDLE_EXIT_SECONDS) and not self._has_loop_work():
                        self._loop = None  # idle: this thread ends, and its OpenMP pool with it
                        return
                if self._closed:
                    break
                arrivals, self._inbox = self._inbox, []
                calls, self._loop_calls = self._loop_calls, []
            for call, future in calls:
                try:
                    future.set_result(call(backend))
                except Exception as error:
                    future.set_exception(error)
            for request in arrivals:
                backend.add(request)
            for request in backend.requests():
                if request.cancel_requested:
                    backend.abort(request)
                    request.finish("cancelled")
            if self._scoring_jobs:
                self._score_next_window(backend)
            if not backend.has_work():
                continue
            try:
                backend.step(self._history.append)
            except Exception as error:  # a failed step fails its requests, never the engine
                log.error("engine step failed:\n%s", traceback.format_exc())
                for request in backend.requests():
                    backend.abort(request)
                    request.finish("error", f"{type(error).__name__}: {error}")
        for request in self._inbox + backend.requests():
            request.finish("aborted", "the engine was closed")
        for _, future in self._loop_calls:
            future.set_exception(RequestError("the engine is closed"))
        for job in self._scoring_jobs:
            job.fail("the engine was closed")
