"""One streamed request to a remote server, on its own thread, behind the same handle as a local request.

`RemoteHandle` mirrors `engine.core.request.RequestHandle`: iterate its `StreamDelta`s, wait for `result()`, or
`cancel()`. The figures are this client's, with engine/core/metrics.py's definitions: TTFT from sending the request
to the first chunk with text, ITL between chunks with text (a chunk may carry more than one token), E2EL to the last
such chunk, TPOT over the server's `usage` token count; token counts and cached tokens come from `usage` (asked for
with `stream_options.include_usage`), never from counting chunks, so a stream's running metrics count no tokens until
the usage arrives at its end. Whatever the server did not honour and the client can see is said in `ignored`.
"""

from __future__ import annotations

import itertools
import json
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

from engine.core.metrics import RequestMetrics
from engine.core.request import RequestOutput, StreamDelta
from engine.core.threads import SIGNAL_CHECK_SECONDS, start_helper_thread
from engine.errors import RemoteError
from engine.remote.client import Call, RemoteClient
from engine.sampling_params import SamplingParams

_request_ids = itertools.count()
NO_USAGE = "stream_options.include_usage"  # the `ignored` key of a reply the server sent no usage for


@dataclass
class RemoteOutput(RequestOutput):
    """A remote request's output: `ignored` maps each parameter the server was seen not to honour (`ignore_eos`,
    `max_tokens`, `stream_options.include_usage`) to what was seen."""

    ignored: dict[str, str] = field(default_factory=dict)


@dataclass
class _Reply:
    """What the stream has said so far."""

    sent: float
    text: list[str] = field(default_factory=list)
    chunk_times: list[float] = field(default_factory=list)
    usage: dict = field(default_factory=dict)
    finish: str | None = None

    def metrics(self, with_itl: bool = True) -> RequestMetrics:
        """`with_itl=False` leaves `itl` empty: O(1) running figures while the stream goes on (as the engine's)."""
        usage = self.usage
        outputs = usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else 0
        details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
        metrics = RequestMetrics(prompt_tokens=usage.get("prompt_tokens") or 0, output_tokens=outputs,
                                 cached_tokens=details.get("cached_tokens") or 0)
        if self.chunk_times:
            metrics.ttft, metrics.e2el = self.chunk_times[0] - self.sent, self.chunk_times[-1] - self.sent
            if with_itl:
                metrics.itl = [b - a for a, b in itertools.pairwise(self.chunk_times)]
            if outputs > 1:
                metrics.tpot = (metrics.e2el - metrics.ttft) / (outputs - 1)
        return metrics


def request_body(model: str, prompt, params: SamplingParams) -> tuple[str, dict]:
    """(path, JSON body) of one streamed request: chat messages to /chat/completions, text or ids to /completions.
    Only what the caller set beyond OpenAI's fields is sent (`top_k`, `ignore_eos`), so a strict server still
    answers a plain request."""
    chat = isinstance(prompt, list) and bool(prompt) and all(isinstance(m, dict) for m in prompt)
    body = {"model": model, ("messages" if chat else "prompt"): prompt, "max_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "stream": True,
            "stream_options": {"include_usage": True}}
    if params.top_k:
        body["top_k"] = params.top_k
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.ignore_eos:
        body["ignore_eos"] = True
    return ("/chat/completions" if chat else "/completions"), body


def ignored_parameters(params: SamplingParams, reply: _Reply) -> dict[str, str]:
    """What the reply shows the server did not honour, by parameter. Only what is visible: a seed, a temperature or
    a top-p not honoured leave no trace in one reply."""
    ignored = {}
    tokens = reply.usage.get("completion_tokens")
    if not reply.usage:
        ignored[NO_USAGE] = "the server sent no usage: token counts are unknown"
    if params.ignore_eos and reply.finish == "stop" and not params.stop \
            and (not isinstance(tokens, int) or tokens < params.max_tokens):
        ignored["ignore_eos"] = f"the reply stopped at {tokens} of {params.max_tokens} tokens"
    if isinstance(tokens, int) and tokens > params.max_tokens:
        ignored["max_tokens"] = f"{tokens} tokens for max_tokens={params.max_tokens}"
    return ignored


class RemoteHandle:
    """The caller's side of a remote request: iterate its deltas, wait for its result, or cancel it (which closes
    the stream). Its thread ends with the request."""

    def __init__(self, client: RemoteClient, prompt, params: SamplingParams):
        self.request_id = next(_request_ids)
        self.prompt_token_ids = list(prompt) if prompt and all(isinstance(t, int) for t in prompt) else []
        self._client, self._watchdog, self._params = client, client.watchdog, params
        self._server = client.target.base_url
        self._path, self._body = request_body(client.target.model, prompt, params)
        self._call = Call()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._text: list[str] = []
        self._last: StreamDelta | None = None
        self._ignored: dict[str, str] = {}
        self.exception: RemoteError | None = None
        self._reply = _Reply(time.perf_counter())
        start_helper_thread(self._run, f"remote-request-{self.request_id}")

    def __iter__(self) -> Iterator[StreamDelta]:
        while self._last is None or not self._last.finished:
            try:  # in slices, so that a Ctrl-C reaches the caller (engine.core.threads)
                delta = self._outbox.get(timeout=SIGNAL_CHECK_SECONDS)
            except queue.Empty:
                continue
            self._text.append(delta.text)
            self._last = delta
            yield delta

    def cancel(self) -> None:
        self._call.end("cancelled")

    @property
    def done(self) -> bool:
        return self._last is not None and self._last.finished

    @property
    def ignored(self) -> dict[str, str]:
        """What the server did not honour (`ignored_parameters`), known once the request has ended."""
        return dict(self._ignored)

    def result(self) -> RemoteOutput:
        """Block until the request ends; a failure is finish_reason "error" with its message (and `exception`), the
        text streamed before it kept."""
        for _ in self:
            pass
        last = self._last
        return RemoteOutput(self.request_id, self.prompt_token_ids, "".join(self._text), [], last.finish_reason,
                            last.metrics, last.error, None, self._ignored)

    # ---- the request's thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        reply, call = self._reply, self._call
        timeouts = self._client.timeouts
        self._watchdog.arm(call, time.monotonic() + timeouts.first_token, lambda: call.end("first_token_timeout"))
        try:
            response = self._client.send("POST", self._client.target.url(self._path), call, self._body)
            try:
                for line in response.iter_lines():
                    read = self._read(line, reply)
                    if read == "done":
                        break
                    if read == "text":
                        self._watchdog.arm(call, time.monotonic() + timeouts.inter_token,
                                           lambda: call.end("inter_token_timeout"))
            finally:
                response.close()
            if reply.finish is None:  # a clean end of the body that did not finish the reply (or our own cut)
                raise RemoteError(self._dropped("the stream ended without a finish reason"), "dropped")
            self._ignored = ignored_parameters(self._params, reply)
            self._finish(reply.finish)
        except (httpx.HTTPError, RemoteError, OSError) as error:
            if call.ended_by == "cancelled":
                self._finish("cancelled")
            else:
                self._fail(self._explain(error, reply))
        except Exception as error:  # a reply of a shape nothing above expects: said, never a caller left waiting
            self._fail(RemoteError(f"{self._server} sent a reply this client cannot read: "
                                   f"{type(error).__name__}: {error}", "bad_reply"))
        finally:
            self._watchdog.disarm(call)

    def _read(self, line: str, reply: _Reply) -> str | None:
        """Take one line of the event stream: "text" when it carried text, "done" at its end marker."""
        if not line.startswith("data:"):
            return None  # blank separators, comments (": keep-alive"), event names
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return "done"
        try:
            event = json.loads(data)
        except ValueError:
            raise RemoteError(f"{self._server} sent an event that is not JSON: {data[:120]!r}",
                              "bad_reply") from None
        if not isinstance(event, dict):
            raise RemoteError(f"{self._server} sent an event that is not a JSON object: {data[:120]!r}",
                              "bad_reply")
        if event.get("error"):
            error = event["error"]
            raise RemoteError(f"{self._server} failed the request mid-stream: "
                              f"{error.get('message') if isinstance(error, dict) else error}", "http")
        if isinstance(event.get("usage"), dict):
            reply.usage = event["usage"]
        text = ""
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            piece = delta.get("content") if "messages" in self._body else choice.get("text")
            if isinstance(piece, str):
                text += piece
            reply.finish = choice.get("finish_reason") or reply.finish
        if text:
            reply.chunk_times.append(time.perf_counter())
            reply.text.append(text)
            self._outbox.put(StreamDelta(text, [], False, None, reply.metrics(with_itl=False)))
            return "text"
        return None

    def _explain(self, error: Exception, reply: _Reply) -> RemoteError:
        """The one RemoteError a failure becomes, by what ended the call."""
        timeouts, server = self._client.timeouts, self._server
        reason = self._call.ended_by
        if reason is None and isinstance(error, httpx.TimeoutException) and not isinstance(error, httpx.ConnectTimeout):
            reason = "inter_token_timeout" if reply.chunk_times else "first_token_timeout"
        if reason == "first_token_timeout":
            return RemoteError(f"{server} sent no text within the first-token timeout ({timeouts.first_token:g} s)",
                               reason)
        if reason == "inter_token_timeout":
            return RemoteError(f"{server} sent nothing more for the inter-token timeout ({timeouts.inter_token:g} s) "
                               f"after {len(reply.chunk_times)} chunk(s) of text", reason)
        if isinstance(error, RemoteError):
            return error
        if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout) \
                or (not reply.chunk_times and "without sending a response" in str(error)):
            return self._client.unreachable(error)
        return RemoteError(self._dropped(f"{type(error).__name__}: {error}"), "dropped")

    def _dropped(self, why: str) -> str:
        return (f"{self._server} dropped the stream mid-reply after {len(self._reply.chunk_times)} chunk(s) "
                f"of text ({why}); the text so far is kept")

    def _finish(self, reason: str) -> None:
        self._outbox.put(StreamDelta("", [], True, reason, self._reply.metrics()))

    def _fail(self, error: RemoteError) -> None:
        self.exception = error
        self._outbox.put(StreamDelta("", [], True, "error", self._reply.metrics(), str(error)))
