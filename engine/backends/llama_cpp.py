"""The llama.cpp backend: the engine's API over llama.cpp in this process, a comparison engine for the native one.

It runs the checkpoint's GGUF file (`engine/gguf/`: the project's float32 conversion, or llama.cpp's own f16, q8_0
and q4_0 made from it) through the llama-cpp-python binding, and is stepped by the same engine loop as the other
backends, so requests, streaming, cancellation, metrics and charts behave the same; only the work underneath differs:

- The engine's tokenizer encodes the prompts, and llama.cpp gets token ids; llama.cpp computes logits, and the
  engine's own sampler picks each token from them (greedy is the argmax, a seeded request draws what the native
  backend draws from the same logits), so a difference in output is a difference in the numbers.
- One sequence at a time: the binding has no continuous batching and no paged KV, so requests queue first in, first
  out, and each step is one `llama_decode` call: a prefill chunk of up to `max_num_batched_tokens` prompt tokens, or
  one decode token. With `prefix_caching`, a prompt keeps the K/V of the prefix it shares with the previous
  request (llama.cpp's cache holds one sequence; nothing older is kept).
- Perplexity (`score`) runs on the same context between requests, never during one.

Guided decoding and speculation are refused (config and submit); log-probabilities come from the same logits.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections import deque
from collections.abc import Callable

import torch

from engine.backends.base import next_token_log_probs
from engine.core.logprobs import LogprobRow, token_logprobs
from engine.core.metrics import peak_memory_bytes
from engine.core.request import Request
from engine.gguf.files import ensure_gguf
from engine.gguf.runtime import LlamaCppSession
from engine.info import EngineStats, StepRecord
from engine.model.sampler import SamplingTensors, greedy, sample
from engine.plan import EnginePlan
from engine.quant.storage import parameter_count
from engine.runner.build import meta_model

log = logging.getLogger(__name__)


def _common_prefix(first: list[int], second: list[int]) -> int:
    """How many leading tokens the two lists share."""
    length = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        length += 1
    return length


class LlamaCppBackend:
    """Serves the engine's requests with llama.cpp, one sequence at a time, first in, first out."""

    def __init__(self, plan: EnginePlan):
        config = plan.config
        threads = torch.get_num_threads()
        self.file = ensure_gguf(plan.path, plan.hf_config, config.gguf_type, threads)
        self.kv_bytes_per_token = plan.kv_bytes_per_token
        self.reuse_prefix = config.prefix_caching
        self.session = LlamaCppSession(self.file, plan.max_model_len, min(config.max_num_batched_tokens,
                                                                           plan.max_model_len),
                                       threads, float32_kv=config.gguf_type == "f32")
        self.num_params = parameter_count(meta_model(plan.spec, torch.float32, "none", "cpu"))
        self.draft_num_params = 0
        self.waiting: deque[Request] = deque()
        self.current: Request | None = None
        self.cached: list[int] = []  # the tokens whose K/V the context holds, from position 0
        self.steps = 0
        self.prompt_tokens = 0
        self.reused_tokens = 0

    # ---- the core protocol ---------------------------------------------------------------------

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return self.current is not None or bool(self.waiting)

    def requests(self) -> list[Request]:
        return ([self.current] if self.current is not None else []) + list(self.waiting)

    def abort(self, request: Request) -> None:
        if request is self.current:
            self.current = None  # its K/V stays: the next prompt may share its prefix
        elif request in self.waiting:
            self.waiting.remove(request)

    def step(self, record: Callable[[StepRecord], None]) -> None:
        if self.current is None:
            self._start(self.waiting.popleft())
        request = self.current
        started = time.perf_counter()
        computed = request.num_computed_tokens
        prompt = request.prompt_token_ids
        if computed < len(prompt):
            tokens = prompt[computed:computed + self.session.n_batch]
        else:
            tokens = request.output_token_ids[-1:]
        try:
            logits = self.session.decode(tokens, computed)
        except Exception as error:  # a failed call fails its request; the K/V it may have written is dropped
            log.error("llama.cpp decode failed:\n%s", traceback.format_exc())
            self._forget_cache()
            self.current = None
            request.finish("error", f"{type(error).__name__}: {error}")
            return
        self.cached += tokens
        request.num_computed_tokens = computed + len(tokens)
        completes = request.num_computed_tokens >= len(prompt)
        now = time.perf_counter()
        count = len(tokens)
        self.steps += 1
        record(StepRecord(time=now, duration=now - started, batch_size=1, num_tokens=count,
                          num_decode_tokens=int(completes), num_running=1, kv_blocks_used=1,
                          num_output_tokens=int(completes), context_tokens=computed + count,
                          attention_pairs=count * computed + count * (count + 1) // 2))
        if completes:
            request.hold_final = True  # its end is published once it is no longer the running request (below)
            try:
                self._deliver(request, logits, now)
            finally:
                if request.finished:
                    self.current = None
                request.release_final()

    def _start(self, request: Request) -> None:
        """Make `request` the running one, keeping the K/V of the prefix it shares with the last sequence (never its
        whole prompt: the last prompt token is computed again for its logits)."""
        prompt = request.prompt_token_ids
        keep = min(_common_prefix(self.cached, prompt), len(prompt) - 1) if self.reuse_prefix else 0
        self.session.keep(keep)
        self.cached = self.cached[:keep]
        request.num_computed_tokens = request.num_cached_tokens = keep
        self.prompt_tokens += len(prompt)
        self.reused_tokens += keep
        self.current = request

    def _deliver(self, request: Request, logits: torch.Tensor, now: float) -> None:
        """Pick the request's next token from llama.cpp's logits ([1, vocab]) with the engine's sampler."""
        params = request.params
        if params.temperature == 0:
            picked = greedy(logits)
        else:
            picked = sample(logits, SamplingTensors.build([params.temperature], [params.top_k], [params.top_p],
                                                          [request.seed], [len(request.output_token_ids)], "cpu"))
        if not bool(picked.valid[0]):
            request.finish("error", "the model produced unusable scores (NaN or infinite logits) for this request")
            return
        token = int(picked.tokens[0])
        logprobs = (token_logprobs(logits, [LogprobRow(0, token, params.logprobs)])
                    if params.logprobs is not None else None)
        try:
            request.append_tokens([token], now, logprobs)
        except Exception as error:
            log.error("request %s failed while taking its token:\n%s", request.request_id, traceback.format_exc())
            request.finish("error", f"{type(error).__name__}: {error}")

    def _forget_cache(self) -> None:
        self.session.keep(0)
        self.cached = []

    # ---- measurements --------------------------------------------------------------------------

    def score(self, token_ids: list[int], chunk_tokens: int | None = None) -> torch.Tensor | None:
        """Next-token log-probabilities after each of token_ids[:-1], by llama.cpp over the context from position 0,
        in steps of `chunk_tokens` (at most the context's batch); None while a request runs (its K/V is there)."""
        if self.current is not None:
            return None
        self._forget_cache()
        step = min(chunk_tokens or self.session.n_batch, self.session.n_batch)
        rows = []
        try:
            for start in range(0, len(token_ids) - 1, step):
                rows.append(self.session.decode(token_ids[start:min(start + step, len(token_ids) - 1)], start,
                                                every_logit=True))
        finally:
            self._forget_cache()
        return next_token_log_probs(torch.cat(rows))

    def decode_profile(self, since: float) -> None:
        """llama.cpp's steps run inside its own graph: not profiled section by section."""
        return None

    def forget_warm_up(self) -> None:
        self.steps = self.prompt_tokens = self.reused_tokens = 0

    def stats(self) -> EngineStats:
        hit_rate = self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return EngineStats(
            weights_bytes=os.path.getsize(self.file), kv_cache_bytes=self.session.n_ctx * self.kv_bytes_per_token,
            kv_cache_used_bytes=len(self.cached) * self.kv_bytes_per_token, kv_blocks_total=1,
            kv_blocks_free=0 if self.cached else 1, kv_block_size=self.session.n_ctx,
            num_running=int(self.current is not None), num_waiting=len(self.waiting),
            peak_running=1 if self.steps else 0, num_preemptions=0, prefix_cache_hit_rate=hit_rate,
            spec_acceptance_rate=0.0, peak_memory_bytes=peak_memory_bytes("cpu"), steps=self.steps,
            notes=(f"llama.cpp: {self.file.name}; weights = the GGUF file's bytes (memory-mapped), KV = one "
                   f"sequence of {self.session.n_ctx} positions",))

    def close(self) -> None:
        self.session.close()

