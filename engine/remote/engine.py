"""`RemoteEngine`: an OpenAI-compatible server behind the calls a caller makes of a local `Engine`.

Why: the bench and the playground measure a served model with the same code they use for the in-process engine
(`submit`, `stream`, `generate`, handles with `StreamDelta`s and `RequestOutput`s), so a remote server is one more
target rather than a second code path. Each request streams on its own thread (many are in flight at once);
`describe` checks the model is served, `server_metrics` reads the server's own figures where it publishes them.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from urllib.parse import quote

from engine.core.request import StreamDelta, stream_of
from engine.errors import RemoteError, RequestError
from engine.remote.client import RemoteClient
from engine.remote.policy import AddressPolicy
from engine.remote.server_metrics import ServerFigure, map_figures, parse_samples
from engine.remote.stream import RemoteHandle, RemoteOutput
from engine.remote.target import RemoteTarget, RemoteTimeouts
from engine.remote.watchdog import Watchdog
from engine.sampling_params import SamplingParams

LISTED_MODELS_SHOWN = 10


class RemoteEngine:
    """Requests to `target`'s model, under `timeouts` and `policy` (default: local mode, anything allowed)."""

    def __init__(self, target: RemoteTarget, timeouts: RemoteTimeouts | None = None,
                 policy: AddressPolicy | None = None):
        self.target = target
        self._watchdog = Watchdog()
        self._client = RemoteClient(target, timeouts or RemoteTimeouts(), policy or AddressPolicy.local(),
                                    self._watchdog)
        self._handles: weakref.WeakSet[RemoteHandle] = weakref.WeakSet()
        self._closed = False

    def submit(self, prompt, params: SamplingParams | None = None) -> RemoteHandle:
        """Send one request (text or token ids to /completions, chat messages to /chat/completions); the handle
        streams it. RequestError for what this client cannot send."""
        if self._closed:
            raise RequestError("the remote engine is closed")
        params = (params or SamplingParams()).validate()
        if params.logprobs is not None or params.guided is not None:
            raise RequestError("log-probabilities and guided decoding are not sent to a remote server")
        if not _is_prompt(prompt):
            raise RequestError("a prompt must be a non-empty string, a list of token ids or a list of chat messages")
        handle = RemoteHandle(self._client, prompt, params)
        self._handles.add(handle)
        return handle

    def generate(self, prompts, params: SamplingParams | None = None) -> list[RemoteOutput]:
        """One output per prompt, in order, all in flight at once; every prompt is checked before any is sent."""
        batch = [prompts] if _is_prompt(prompts) else list(prompts)
        if not batch or not all(_is_prompt(prompt) for prompt in batch):
            raise RequestError("generate() takes a prompt or a non-empty list of prompts")
        return [handle.result() for handle in [self.submit(prompt, params) for prompt in batch]]

    def stream(self, prompt, params: SamplingParams | None = None) -> Iterator[StreamDelta]:
        """Yield deltas as they arrive; closing the generator early closes the stream."""
        return stream_of(lambda: self.submit(prompt, params))

    def describe(self) -> dict:
        """{"model", "models" (the ids /models lists), "config", "engine"}: the last two from this project's own
        `/v1/models/{id}` extras, None from other servers. RemoteError naming the served models when the model is
        not one of them (a model the list omits counts when `/models/{id}` knows it, as this project's MODEL@PRESET
        ids)."""
        listing = self._client.get_json(self.target.url("/models"))
        data = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(data, list):
            raise RemoteError(f"{self.target.url('/models')} is not an OpenAI model list", "bad_reply")
        models = [entry.get("id") for entry in data if isinstance(entry, dict) and isinstance(entry.get("id"), str)]
        try:
            extras = self._client.get_json(self.target.url(f"/models/{quote(self.target.model, safe='/@:')}"))
        except RemoteError as error:
            if self.target.model not in models and error.kind in ("unknown_model", "http"):
                shown = ", ".join(models[:LISTED_MODELS_SHOWN]) + (", ..." if len(models) > LISTED_MODELS_SHOWN else "")
                raise RemoteError(f"{self.target.base_url} does not serve the model {self.target.model!r}; it serves: "
                                  f"{shown or 'no models'}", "unknown_model") from None
            if error.kind not in ("unknown_model", "http"):
                raise
            extras = {}
        extras = extras if isinstance(extras, dict) else {}
        return {"model": self.target.model, "models": models, "config": extras.get("config"),
                "engine": extras.get("engine")}

    def server_metrics(self) -> list[ServerFigure] | None:
        """The server's own figures from `{server root}/metrics` (`server_metrics.MAPPING`); None when it publishes
        no such page or, in public mode, when the allow-list does not cover it; [] when it has none of the series
        mapped."""
        url = self.target.server_root + "/metrics"
        try:
            self._client.policy.entry_for(url)
        except RemoteError:
            return None
        try:
            text = self._client.get_text(url)
        except RemoteError as error:
            if error.kind in ("http", "unknown_model"):
                return None
            raise
        return map_figures(parse_samples(text))

    def close(self) -> None:
        """Refuse new requests, cancel those in flight, and release the client."""
        self._closed = True
        for handle in list(self._handles):
            handle.cancel()
        self._client.close()

    def __enter__(self) -> RemoteEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_prompt(prompt) -> bool:
    if isinstance(prompt, str):
        return bool(prompt)
    if not isinstance(prompt, list) or not prompt:
        return False
    return all(isinstance(t, int) and not isinstance(t, bool) for t in prompt) \
        or all(isinstance(m, dict) for m in prompt)
