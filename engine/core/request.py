"""A request's life: its tokens and timestamps inside the engine, and the handle its caller holds.

The engine loop owns `Request` objects (one thread touches them); callers hold a
`RequestHandle` and read `StreamDelta`s from a thread-safe queue, so any number of caller
threads can wait on their own requests while one loop batches them all.
"""

from __future__ import annotations

import itertools
import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.logprobs import TokenLogprob
from engine.core.metrics import RequestMetrics
from engine.core.threads import SIGNAL_CHECK_SECONDS
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.core.grammar_state import RequestGrammar

_request_ids = itertools.count()


@dataclass
class StreamDelta:
    """What one engine step added to a request: new text and ids, plus its running metrics; `logprobs` has one
    entry per id when the request asked for them (`SamplingParams.logprobs`), else none."""

    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    metrics: RequestMetrics
    error: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass
class RequestOutput:
    """The finished result of one request (`logprobs`: one per token id, None when the request did not ask)."""

    request_id: int
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str
    metrics: RequestMetrics
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None


@dataclass(eq=False)
class Request:
    """Engine-side state of one request. Only the engine loop thread mutates it (identity equality).

    Speculative decoding keeps its bookkeeping here too: `spec_token_ids` are the tokens proposed
    for the next step (the scheduler takes them), `draft_num_computed_tokens` how many leading
    tokens the draft model holds K/V for (it trails or leads `num_computed_tokens`), and the
    `spec_*` counters are this request's verified proposals, accepted tokens and verification steps.

    Guided decoding: `grammar` is the request's place in its grammar (advanced by every token it emits; a
    complete grammar ends the request with "stop"), `guided_mask_s` its share of the measured mask work so far,
    `guided_compile_s` what compiling its grammar cost (0 from the cache).
    """

    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int]
    max_model_len: int
    detokenizer: IncrementalDetokenizer
    seed: int
    request_id: int = field(default_factory=lambda: next(_request_ids))
    arrival_time: float = field(default_factory=time.perf_counter)
    output_token_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int | None = None
    spec_token_ids: list[int] = field(default_factory=list)
    draft_num_computed_tokens: int = 0
    spec_proposed: int = 0
    spec_accepted: int = 0
    spec_drafts: int = 0
    grammar: RequestGrammar | None = None
    guided_mask_s: float = 0.0
    guided_compile_s: float = 0.0
    kv_transfer_bytes: int = 0     # disaggregation: K/V bytes moved prefill -> decode for it, and the workers' seconds
    kv_transfer_s: float = 0.0
    finish_reason: str | None = None
    error: str | None = None
    cancel_requested: bool = False
    outbox: queue.SimpleQueue = field(default_factory=queue.SimpleQueue, repr=False)
    # While set, the final delta waits in `held_final` until `release_final()`: the engine publishes a
    # request's end only once its KV blocks are free, so a caller that sees it finished sees them free.
    hold_final: bool = False
    held_final: StreamDelta | None = field(default=None, repr=False)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def metrics(self) -> RequestMetrics:
        """Running figures; the inter-token gaps are listed only once the request has finished,
        so streaming a long answer costs O(1) per token rather than O(length)."""
        metrics = RequestMetrics.from_timestamps(
            self.arrival_time, self.token_times, len(self.prompt_token_ids), self.num_cached_tokens or 0,
            self.spec_proposed, self.spec_accepted, self.spec_drafts, with_itl=self.finished)
        metrics.guided_mask_s = self.guided_mask_s
        metrics.guided_compile_s = self.guided_compile_s
        metrics.kv_transfer_bytes = self.kv_transfer_bytes
        metrics.kv_transfer_s = self.kv_transfer_s
        return metrics

    def append_tokens(self, token_ids: list[int], now: float, logprobs: list[TokenLogprob] | None = None) -> None:
        """Record newly sampled tokens (and their log-probabilities, one each, when asked for), decide whether the
        request is done, and publish a delta.

        Tokens past a stop condition (EOS, a complete grammar, stop string, max_tokens, context length) are dropped,
        with theirs. A token the request's grammar rejects raises `GuidedDecodingError` (the engine fails the request).
        """
        accepted: list[int] = []
        for token in token_ids:
            accepted.append(token)
            self.output_token_ids.append(token)
            self.token_times.append(now)
            if self.grammar is not None and self.grammar.advance(token):
                self.finish_reason = "stop"
            elif not self.params.ignore_eos and token in self.eos_token_ids:
                self.finish_reason = "stop"
            elif len(self.output_token_ids) >= self.params.max_tokens or self.num_tokens >= self.max_model_len:
                self.finish_reason = "length"
            if self.finish_reason:
                break
        text, hit_stop = self.detokenizer.add(accepted)
        if hit_stop:
            self.finish_reason = "stop"
        if self.finished and not hit_stop:
            text += self.detokenizer.flush()
        self._publish(StreamDelta(text, accepted, self.finished, self.finish_reason, self.metrics(),
                                  logprobs=list(logprobs[:len(accepted)]) if logprobs else []))

    def finish(self, reason: str, error: str | None = None) -> None:
        """End the request without a new token: "cancelled" by its caller, "aborted" by the engine
        closing, or "error" (failed, with `error` saying why)."""
        if self.finished:
            return
        self.finish_reason = reason
        self.error = error
        text = self.detokenizer.flush() if reason in ("cancelled", "aborted") else ""
        self._publish(StreamDelta(text, [], True, reason, self.metrics(), error))

    def _publish(self, delta: StreamDelta) -> None:
        if delta.finished and self.hold_final:
            self.held_final = delta
        else:
            self.outbox.put(delta)

    def release_final(self) -> None:
        """Stop holding back the final delta, and publish it if it was held."""
        self.hold_final = False
        if self.held_final is not None:
            self.outbox.put(self.held_final)
            self.held_final = None


class RequestHandle:
    """The caller's side of a request: iterate its deltas, wait for its result, or cancel it."""

    def __init__(self, request: Request, cancel: Callable[[], None]):
        self.request_id = request.request_id
        self.prompt_token_ids = list(request.prompt_token_ids)
        self._outbox = request.outbox
        self._cancel = cancel
        self._text: list[str] = []
        self._token_ids: list[int] = []
        self._logprobs: list[TokenLogprob] | None = None if request.params.logprobs is None else []
        self._last: StreamDelta | None = None

    def __iter__(self) -> Iterator[StreamDelta]:
        while self._last is None or not self._last.finished:
            try:  # in slices, so that a Ctrl-C that reached another thread interrupts this wait (engine.core.threads)
                delta = self._outbox.get(timeout=SIGNAL_CHECK_SECONDS)
            except queue.Empty:
                continue
            self._text.append(delta.text)
            self._token_ids.extend(delta.token_ids)
            if self._logprobs is not None:
                self._logprobs.extend(delta.logprobs)
            self._last = delta
            yield delta

    def cancel(self) -> None:
        self._cancel()

    @property
    def done(self) -> bool:
        return self._last is not None and self._last.finished

    def result(self) -> RequestOutput:
        """Block until the request finishes and return its output."""
        for _ in self:
            pass
        last = self._last
        return RequestOutput(self.request_id, self.prompt_token_ids, "".join(self._text), self._token_ids,
                             last.finish_reason, last.metrics, last.error, self._logprobs)


def stream_of(submit: Callable[[], RequestHandle]) -> Iterator[StreamDelta]:
    """The deltas of the request `submit()` sends once the stream is first read (so a refusal at submission raises
    there); closing the stream before the request finished cancels it. Every engine's `stream` (in-process, served
    elsewhere) is this over its own `submit`."""
    handle = submit()
    try:
        yield from handle
    finally:
        if not handle.done:
            handle.cancel()
