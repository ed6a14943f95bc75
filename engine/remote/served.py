"""`ServedModel`: the engine's public surface (`Engine`'s) over a model that an OpenAI-compatible server serves.

Why: the playground and the bench chat with, compare and measure an `Engine`; a model served by vLLM, SGLang,
llama.cpp's server or this app's own `/v1` should go everywhere a local engine goes without a second code path in
each of them. So this class answers the same calls: it encodes prompts with the configuration's `model` tokenizer
(the same token ids a local engine of that model would get: two engines compared are given the same work), sends
them through the careful client (`engine/remote/client.py`), and reports what can be known from outside: figures
measured at this client, token counts from the server's `usage`, and the server's own `/metrics` where it has them.
What a server cannot give (the engine's step history, a decode profile, perplexity, guided decoding and
log-probabilities through this client) is refused or empty, and said, never estimated.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

from engine.config import EngineConfig
from engine.core.metrics import RequestMetrics, describe_device
from engine.core.request import RequestOutput, StreamDelta, stream_of
from engine.errors import ModelLoadError, RemoteError, RequestError
from engine.hub import load_tokenizer
from engine.info import EngineInfo, EngineStats, StepRecord
from engine.plan import plan_engine
from engine.prompts import PromptEncoder, encode_prompt, prompt_batch
from engine.remote.engine import RemoteEngine
from engine.remote.policy import AddressPolicy
from engine.remote.server_metrics import ServerFigure
from engine.remote.stream import NO_USAGE, RemoteHandle, RemoteOutput
from engine.remote.target import RemoteTarget
from engine.sampling_params import GuidedDecoding, SamplingParams

SERVER_METRICS_MAX_AGE_S = 1.0  # the live charts ask for stats twice a second; /metrics is read at most once a second
NOT_FROM_A_SERVER = "runs on the server: {what} is not available through an OpenAI-compatible client"


class ServedModel:
    """A served model behind `Engine`'s calls: `encode`, `submit`, `stream`, `generate`, `stats`, `info`, `close`."""

    def __init__(self, config: EngineConfig, policy: AddressPolicy | None = None):
        started = time.perf_counter()
        self.plan = plan_engine(config)
        self.config = self.plan.config
        self.tokenizer = load_tokenizer(self.plan.path)
        self._prompts = PromptEncoder(self.tokenizer) if self.tokenizer is not None else None
        target = RemoteTarget(self.config.remote_url, self.config.remote_model, self.config.remote_api_key_env or None)
        self._client = RemoteEngine(target, policy=policy)
        self._metrics_lock = threading.Lock()
        self._metrics: tuple[float, EngineStats] | None = None
        self._closed, self._send_text = False, False
        try:
            self._client.describe()  # unreachable, 401, unknown model: one clear error now, not on a user's reply
            prompt_form = self._check_first_reply()
        except RemoteError as error:
            self._client.close()
            raise ModelLoadError(str(error)) from None
        self.info = EngineInfo(
            model=self.config.model, path=str(self.plan.path), architecture=self.plan.architecture, backend="remote",
            device=self.config.remote_url, device_name=f"a server at {self.config.remote_url} (seen from "
                                                       f"{describe_device()})",
            dtype="the server's", kv_cache_dtype="the server's", attention="the server's", quantization="the server's",
            max_model_len=self.plan.max_model_len, vocab_size=self.plan.vocab_size, num_params=0, num_kv_heads=0,
            kv_bytes_per_token=0, cuda_graphs=False, cpu_kernels=False, tensor_parallel_size=1, draft_model=None,
            draft_num_params=0, load_seconds=time.perf_counter() - started, warmup_seconds=0.0,
            notices=self.plan.notices + ((prompt_form,) if prompt_form else ()))

    def _check_first_reply(self) -> str | None:
        """One token of a short prompt, sent as token ids (every later request is sent the same way): a server that
        refuses ids but answers their text is sent text from then on (the returned notice says so); one that answers
        neither fails the load with its reason."""
        ids = self.encode("Hello")
        as_ids = self._client.submit(ids, SamplingParams(max_tokens=1)).result()
        if as_ids.finish_reason != "error":
            return None
        as_text = self._client.submit(self._text_of(ids), SamplingParams(max_tokens=1)).result()
        if as_text.finish_reason == "error":
            raise RemoteError(f"the server failed a one-token request: {as_ids.error}", "http")
        self._send_text = True
        return ("this server takes no token-id prompts: each prompt's ids are sent as their text (control tokens "
                "included), which the server tokenizes again")

    def _text_of(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            raise RequestError("this server takes text prompts, and the model has no tokenizer to write them")
        return self.tokenizer.decode(ids)

    # ---- prompts -------------------------------------------------------------------------------

    @property
    def renders_tools(self) -> bool:
        return self._prompts is not None and self._prompts.renders_tools

    def encode(self, prompt, tools: list[dict] | None = None) -> list[int]:
        """Token ids as the local engine of `config.model` would encode them (`engine.prompts.encode_prompt`)."""
        if self._closed:
            raise RequestError("the engine is closed")
        return encode_prompt(self._prompts, prompt, tools, self.plan.vocab_size, self.config.max_model_len)

    # ---- requests ------------------------------------------------------------------------------

    def submit(self, prompt, params: SamplingParams | None = None):
        """Send one request; the handle streams its deltas, waits for its result or cancels it (closing the
        stream)."""
        if params is not None and not isinstance(params, SamplingParams):
            raise RequestError(f"params must be SamplingParams, got {type(params).__name__}")
        params = (params or SamplingParams()).validate()
        if params.logprobs is not None:
            raise RequestError(NOT_FROM_A_SERVER.format(what="token log-probabilities"))
        if params.guided is not None:
            self.check_guided(params.guided)
        ids = self.encode(prompt)
        handle = self._client.submit(self._text_of(ids) if self._send_text else ids, params)
        return ServedHandle(handle, ids, self.tokenizer, params)

    def generate(self, prompts, params: SamplingParams | None = None) -> list[RequestOutput]:
        """One output per prompt, in order, sent together (the server batches them as it does)."""
        encoded = [self.encode(prompt) for prompt in prompt_batch(prompts)]  # every prompt checked before any is sent
        handles = [self.submit(ids, params) for ids in encoded]
        return [handle.result() for handle in handles]

    def stream(self, prompt, params: SamplingParams | None = None) -> Iterator[StreamDelta]:
        """Yield text deltas as they arrive; closing the generator early cancels the request."""
        return stream_of(lambda: self.submit(prompt, params))

    def check_guided(self, guided: GuidedDecoding) -> None:
        raise RequestError(NOT_FROM_A_SERVER.format(what="guided decoding (structured output)"))

    # ---- figures -------------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        """The server's own figures from its `/metrics` (read at most once a second), or zeros with a note saying
        the server publishes none; `closed` once closed."""
        if self._closed:
            return EngineStats(closed=True)
        with self._metrics_lock:
            now = time.monotonic()
            if self._metrics is None or now - self._metrics[0] > SERVER_METRICS_MAX_AGE_S:
                self._metrics = (now, self._server_stats())
            return self._metrics[1]

    def _server_stats(self) -> EngineStats:
        try:
            figures = self._client.server_metrics()
        except RemoteError as error:
            return EngineStats(notes=(f"the server's /metrics could not be read: {error}",))
        if figures is None:
            return EngineStats(notes=(f"{self.config.remote_url} publishes no Prometheus /metrics: only this "
                                      "client's own figures are shown",))
        return server_stats(figures)

    def step_history(self, since: float = 0.0) -> list[StepRecord]:
        """A server's steps are not visible from outside: none."""
        return []

    def decode_profile(self, since: float = 0.0):
        return None

    def perplexity(self, texts=None, progress=None):
        raise RequestError(NOT_FROM_A_SERVER.format(what="perplexity (the whole next-token distribution)"))

    held_out_perplexity = None

    def close(self) -> None:
        """Cancel what is in flight and close the client's connections."""
        if not self._closed:
            self._closed = True
            self._client.close()

    def __enter__(self) -> ServedModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def server_stats(figures: list[ServerFigure]) -> EngineStats:
    """A server's Prometheus figures as the engine's stats where they mean the same thing (running and waiting
    requests, prefix-cache hits, speculative acceptance), every figure also as a note naming its source series."""
    values = {figure.label: figure.value for figure in figures}
    notes = tuple(f"{figure.label}: {figure.value:g} ({figure.source} {figure.series})" for figure in figures)
    return EngineStats(num_running=int(values.get("requests running", 0)),
                       num_waiting=int(values.get("requests waiting", 0)),
                       prefix_cache_hit_rate=values.get("prefix cache hit rate", 0.0),
                       spec_acceptance_rate=values.get("speculative acceptance rate", 0.0),
                       notes=notes or ("the server's /metrics has none of the series this client maps",))


class ServedHandle:
    """A served request's handle (`RemoteHandle`) with its prompt's token ids, and token counts made by this client's
    tokenizer where the server sent no `usage` (llama.cpp's Python server streams none): the prompt's own ids, and
    the reply's text encoded again plus the end-of-sequence token that stopped it (as servers count it), said in
    `ignored`, so the figures are never silently zero."""

    def __init__(self, handle: RemoteHandle, prompt_ids: list[int], tokenizer, params: SamplingParams):
        self._handle, self.prompt_token_ids, self._tokenizer = handle, prompt_ids, tokenizer
        self._stops_at_eos = not params.stop
        self.request_id = handle.request_id
        self._text: list[str] = []

    def __iter__(self) -> Iterator[StreamDelta]:
        for delta in self._handle:
            self._text.append(delta.text)
            if delta.finished:
                delta = dataclasses.replace(delta, metrics=self._counted(delta.metrics, delta.finish_reason))
            yield delta

    def cancel(self) -> None:
        self._handle.cancel()

    @property
    def done(self) -> bool:
        return self._handle.done

    @property
    def exception(self):
        return self._handle.exception

    @property
    def ignored(self) -> dict[str, str]:
        ignored = self._handle.ignored
        if NO_USAGE in ignored and self._tokenizer is not None:
            ignored[NO_USAGE] = "the server sent no usage: tokens counted by this client's tokenizer"
        return ignored

    def result(self) -> RemoteOutput:
        for _ in self:
            pass
        output = self._handle.result()
        return dataclasses.replace(output, prompt_token_ids=self.prompt_token_ids,
                                   metrics=self._counted(output.metrics, output.finish_reason),
                                   ignored=self.ignored)

    def _counted(self, metrics: RequestMetrics, finish_reason: str | None) -> RequestMetrics:
        if NO_USAGE not in self._handle.ignored or self._tokenizer is None:
            return metrics
        outputs = len(self._tokenizer.encode("".join(self._text), add_special_tokens=False))
        if finish_reason == "stop" and self._stops_at_eos:
            outputs += 1
        counted = dataclasses.replace(metrics, prompt_tokens=len(self.prompt_token_ids), output_tokens=outputs)
        if outputs > 1 and metrics.ttft is not None and metrics.e2el is not None:
            counted.tpot = (metrics.e2el - metrics.ttft) / (outputs - 1)
        return counted
