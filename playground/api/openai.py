"""OpenAI-compatible endpoints (`/v1/models`, `/v1/chat/completions`, `/v1/completions`) on the playground's server.

Why: the official `openai` client, and every tool built on it, can then talk to the engines the
playground serves, over the same engine pool (a request for a configuration a browser tab uses is
batched with that tab's chat) and under the same hosting limits: the allow-list, the token,
message and stop caps, the memory budget, and a bound on requests in flight (429 beyond it).

A model id is a model name (curated name, hub id or path, as the allow-list permits), optionally
followed by `@preset` to serve it with an optimization preset, e.g. `demo@no-prefix-cache`.
Usage figures are the engine's own counts (`prompt_tokens`, `completion_tokens`, and
`prompt_tokens_details.cached_tokens` from the prefix cache); each response also carries the
engine's per-request `metrics` (TTFT, TPOT, E2EL) as an extension field. Streaming uses
server-sent events ending with `data: [DONE]`; a client that disconnects cancels its requests.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
import weakref

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine import EngineConfig, EngineError, RequestError
from playground.figures.replies import reply_figures
from playground.shared.configs import default_config, preset_config
from playground.shared.context import PlaygroundContext
from playground.shared.conversation import as_prompt
from playground.shared.errors import Refused
from playground.shared.sampling import parse_sampling

MAX_PROMPTS = 16
MAX_MESSAGES = 256
ROLES = ("system", "user", "assistant")
# Fields of OpenAI requests this server does not implement: refused unless absent or at their neutral value.
UNSUPPORTED = {"logprobs": (None, False), "top_logprobs": (None, 0), "tools": (None, []), "functions": (None, []),
               "tool_choice": (None, "none"), "response_format": (None, {"type": "text"}), "echo": (None, False),
               "suffix": (None, ""), "best_of": (None, 1), "presence_penalty": (None, 0, 0.0),
               "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}), "n": (None, 1)}
FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


class APIError(Exception):
    """An error answered in OpenAI's format: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": str(self), "type": self.kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status)


class _Job:
    """The requests of one API call on one leased engine.

    `close` (once, whoever calls it first) cancels what still runs, returns the lease and frees the
    call's place among the requests in flight.
    """

    def __init__(self, pool, entry, on_close):
        self.engine = entry.engine
        self.handles: list = []
        self._pool, self._entry, self.on_close = pool, entry, on_close
        self._closed = threading.Lock()

    def close(self) -> None:
        if not self._closed.acquire(blocking=False):
            return
        for handle in self.handles:
            if not handle.done:
                handle.cancel()
        self._pool.release(self._entry)
        self.on_close()


class OpenAIService:
    """Turns OpenAI requests into engine requests on the context's pool."""

    def __init__(self, context: PlaygroundContext):
        self.context = context
        self.settings = context.settings
        self._in_flight = 0
        self._lock = threading.Lock()

    # ----- admission and configuration ------------------------------------------------------

    def _admit(self) -> None:
        limit = self.settings.max_concurrent_chats + self.settings.max_queue
        with self._lock:
            if self._in_flight >= limit:
                raise APIError(429, f"the server is busy ({limit} requests in flight); retry shortly",
                               kind="rate_limit_error", code="server_busy")
            self._in_flight += 1

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def config_for(self, model) -> EngineConfig:
        """The engine configuration of a model id (`name` or `name@preset`), validated under the hosting limits."""
        if not isinstance(model, str) or not model.strip() or len(model) > 300:
            raise APIError(400, "model must be a model id (see /v1/models)", param="model")
        name, _, preset = model.strip().partition("@")
        try:
            fields = preset_config(preset, name, self.context.presets) if preset else default_config(name)
            return self.context.validate(fields)
        except (EngineError, Refused) as error:
            status = 403 if "not allowed" in str(error) else 400
            raise APIError(status, self.context.describe(error), param="model",
                           code="model_not_found" if status == 403 else None) from None

    def engine_figures(self, config: EngineConfig) -> dict | None:
        """What a loaded engine of `config` reports about itself (None when it is not loaded: a GET loads nothing)."""
        with self.context.pool.lease_if_loaded(config) as entry:
            if entry is None:
                return None
            info = entry.engine.info
            return {key: getattr(info, key) for key in ("backend", "attention", "dtype", "device", "vocab_size",
                                                        "max_model_len", "num_params")}

    def model_ids(self) -> list[str]:
        allowed = self.settings.allowed_models
        names = [name for name in self.context.models if allowed is None or name in allowed]
        default = self.context.default_config.model
        return [default] + [name for name in names if name != default]

    # ----- requests -------------------------------------------------------------------------

    def _sampling(self, body: dict, prompt_tokens: list[int], max_model_len: int):
        for field, neutral in UNSUPPORTED.items():
            if body.get(field) not in neutral:
                raise APIError(400, f"{field} is not supported by this server", param=field)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            longest = max(len(ids) for ids in prompt_tokens)
            max_tokens = max(1, min(self.settings.max_new_tokens, max_model_len - longest))
        try:
            return parse_sampling(self.settings, max_tokens, body.get("temperature", 1.0), body.get("top_p", 1.0),
                                  body.get("top_k", 0), body.get("seed"), body.get("stop"),
                                  body.get("ignore_eos", False))
        except Refused as error:
            raise APIError(400, str(error)) from None

    def _messages(self, messages) -> list[dict]:
        if not isinstance(messages, list) or not messages or len(messages) > MAX_MESSAGES:
            raise APIError(400, f"messages must be a list of 1 to {MAX_MESSAGES} messages", param="messages")
        cleaned = []
        for message in messages:
            if not isinstance(message, dict) or message.get("role") not in ROLES:
                raise APIError(400, f"each message needs a role among {', '.join(ROLES)}", param="messages")
            content = message.get("content")
            if isinstance(content, list):  # content parts: only text is understood here
                if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                           for p in content):
                    raise APIError(400, "only text content parts are supported", param="messages")
                content = "".join(p["text"] for p in content)
            if not isinstance(content, str):
                raise APIError(400, "each message's content must be text", param="messages")
            if len(content) > self.settings.max_message_chars:
                raise APIError(400, f"a message is {len(content):,} characters; this server takes at most "
                                    f"{self.settings.max_message_chars:,}", param="messages")
            cleaned.append({"role": message["role"], "content": content})
        return cleaned

    def _prompts(self, prompt) -> list:
        prompts = [prompt] if isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                                          and all(isinstance(t, int) for t in prompt)) else prompt
        if not isinstance(prompts, list) or not prompts or len(prompts) > MAX_PROMPTS:
            raise APIError(400, f"prompt must be a string, a list of token ids, or a list of 1 to {MAX_PROMPTS} "
                                "of those", param="prompt")
        for item in prompts:
            is_ids = isinstance(item, list) and item and all(isinstance(t, int) and not isinstance(t, bool)
                                                             for t in item)
            if not (isinstance(item, str) or is_ids):
                raise APIError(400, "each prompt must be a string or a non-empty list of token ids", param="prompt")
            if len(item) > self.settings.max_message_chars:
                raise APIError(400, f"a prompt may be at most {self.settings.max_message_chars:,} characters or "
                                    "tokens", param="prompt")
        return prompts

    def _start(self, body: dict, prompts: list, kind: str) -> tuple[_Job, dict]:
        """Lease the engine, encode every prompt, check the limits, submit; runs in a worker thread.

        On success the returned job owns the caller's place in flight; on failure that place is freed.
        """
        try:
            return self._submit(body, prompts, kind)
        except BaseException:
            self._leave()
            raise

    def _submit(self, body: dict, prompts: list, kind: str) -> tuple[_Job, dict]:
        config = self.config_for(body.get("model"))
        try:
            entry = self.context.pool.acquire(config)
        except Exception as error:  # a load that failed or is over budget: the caller's problem to report
            raise APIError(503 if not isinstance(error, EngineError | Refused) else 400,
                           self.context.describe(error), kind="server_error"
                           if not isinstance(error, EngineError | Refused) else "invalid_request_error") from None
        job = _Job(self.context.pool, entry, on_close=lambda: None)
        try:
            engine = job.engine
            max_model_len = engine.info.max_model_len
            if kind == "chat":
                template = bool(getattr(engine.tokenizer, "chat_template", None))
                prompts = [as_prompt(template, messages) for messages in prompts]
            try:
                ids = [engine.encode(p) for p in prompts]
            except RequestError as error:
                raise APIError(400, self.context.describe(error),
                               code="context_length_exceeded" if "max_model_len" in str(error) else None) from None
            longest = max(len(i) for i in ids)
            if longest > self.settings.max_prompt_tokens:
                raise APIError(400, f"the prompt is {longest} tokens; this server allows "
                                    f"{self.settings.max_prompt_tokens} (PLAYGROUND_MAX_PROMPT_TOKENS)",
                               code="context_length_exceeded")
            params = self._sampling(body, ids, max_model_len)
            speculative = config.speculative != "off"
            job.handles = [engine.submit(prompt_ids, params) for prompt_ids in ids]
        except BaseException:
            job.close()
            raise
        job.on_close = self._leave
        return job, {"speculative": speculative}

    # ----- responses ------------------------------------------------------------------------

    @staticmethod
    def _usage(outputs_metrics: list) -> dict:
        prompt = sum(m.prompt_tokens for m in outputs_metrics)
        completion = sum(m.output_tokens for m in outputs_metrics)
        cached = sum(m.cached_tokens for m in outputs_metrics)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    async def respond(self, request: Request, kind: str):
        """One `/v1/chat/completions` (kind "chat") or `/v1/completions` (kind "text") request."""
        try:
            body = await request.json()
        except ValueError:
            return APIError(400, "the request body must be JSON").response()
        try:
            if not isinstance(body, dict):
                raise APIError(400, "the request body must be a JSON object")
            prompts = [self._messages(body.get("messages"))] if kind == "chat" else self._prompts(body.get("prompt"))
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise APIError(400, "stream must be true or false", param="stream")
            self._admit()
        except APIError as error:
            return error.response()
        try:
            job, extra = await anyio.to_thread.run_sync(self._start, body, prompts, kind)
        except APIError as error:
            return error.response()
        meta = {"id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}", "created": int(time.time()),
                "model": body["model"]}
        if not stream:
            try:
                outputs = await anyio.to_thread.run_sync(lambda: [h.result() for h in job.handles])
            finally:
                job.close()
            return self._complete(kind, meta, outputs, extra["speculative"])
        options = body.get("stream_options") or {}
        events = self._events(kind, meta, job, extra["speculative"],
                              bool(isinstance(options, dict) and options.get("include_usage")))
        weakref.finalize(events, job.close)  # a stream that never starts still returns its lease and place
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def _complete(self, kind: str, meta: dict, outputs: list, speculative: bool) -> JSONResponse:
        failed = [o for o in outputs if o.finish_reason == "error"]
        if failed:
            return APIError(500, f"the engine failed this request: {failed[0].error}", kind="server_error").response()
        choices = []
        for index, output in enumerate(outputs):
            choice = {"index": index, "finish_reason": FINISH.get(output.finish_reason, "stop"), "logprobs": None}
            if kind == "chat":
                choice["message"] = {"role": "assistant", "content": output.text}
            else:
                choice["text"] = output.text
            choices.append(choice)
        return JSONResponse({**meta, "object": "chat.completion" if kind == "chat" else "text_completion",
                             "choices": choices, "usage": self._usage([o.metrics for o in outputs]),
                             "metrics": [reply_figures(o.metrics, speculative) for o in outputs]})

    async def _events(self, kind: str, meta: dict, job: _Job, speculative: bool, include_usage: bool):
        """Server-sent events: one chunk per engine delta, a final chunk per choice, usage if asked, [DONE]."""
        chunk_type = "chat.completion.chunk" if kind == "chat" else "text_completion"
        deltas: queue.Queue = queue.Queue()

        def pump(index: int, handle) -> None:
            for delta in handle:
                deltas.put((index, delta))

        for index, handle in enumerate(job.handles):
            threading.Thread(target=pump, args=(index, handle), name="openai-stream", daemon=True).start()

        def chunk(index: int, text: str | None, finish: str | None, first: bool = False) -> str:
            if kind == "chat":
                delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
                choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": None}
            return f"data: {json.dumps({**meta, 'object': chunk_type, 'choices': [choice]})}\n\n"

        try:
            if kind == "chat":
                for index in range(len(job.handles)):
                    yield chunk(index, None, None, first=True)
            finished, metrics = 0, {}
            while finished < len(job.handles):
                index, delta = await anyio.to_thread.run_sync(deltas.get)
                if delta.finished and delta.finish_reason == "error":
                    error = {"message": f"the engine failed this request: {delta.error}", "type": "server_error"}
                    yield f"data: {json.dumps({'error': error})}\n\n"
                    return
                if delta.text:
                    yield chunk(index, delta.text, None)
                if delta.finished:
                    finished += 1
                    metrics[index] = delta.metrics
                    yield chunk(index, None, FINISH.get(delta.finish_reason, "stop"))
            if include_usage:
                ordered = [metrics[i] for i in range(len(job.handles))]
                usage = {**meta, "object": chunk_type, "choices": [], "usage": self._usage(ordered),
                         "metrics": [reply_figures(m, speculative) for m in ordered]}
                yield f"data: {json.dumps(usage)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            job.close()


def build_router(service: OpenAIService) -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                            "owned_by": "inference-playground"} for name in service.model_ids()]}

    @router.get("/models/{model_id:path}")
    def model(model_id: str):
        try:
            config = service.config_for(model_id)
        except APIError as error:
            return error.response()
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "inference-playground",
                "config": config.to_dict(), "engine": service.engine_figures(config)}

    @router.post("/chat/completions")
    async def chat_completions(request: Request):
        return await service.respond(request, "chat")

    @router.post("/completions")
    async def completions(request: Request):
        return await service.respond(request, "text")

    return router


def openai_routes(context: PlaygroundContext) -> list:
    """The /v1 routes, for the server Gradio runs (they share its process, port and engine pool)."""
    return list(build_router(OpenAIService(context)).routes)
