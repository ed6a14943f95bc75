"""OpenAI-compatible endpoints (`/v1/models`, `/v1/chat/completions`, `/v1/completions`) on the playground's server.

Why: the official `openai` client, and every tool built on it, can then talk to the engines the
playground serves, over the same engine pool (a request for a configuration a browser tab uses is
batched with that tab's chat) and under the same hosting limits: the allow-list, the token,
message, conversation and stop caps, the memory budget, and the bounds on calls and tokens in
flight (`admission.py`, 429 beyond them). Everything a request asks for is done as asked, refused, or
documented as ignored (`fields.py`): a field this server does not implement (or does not know) is a 400
naming it, and a prompt that leaves no room for its `max_tokens` is a 400, as vLLM answers it. This
module runs a call; its parts live beside it: which models exist (`models.py`), `n` choices
(`choices.py`), log-probabilities (`logprobs.py`), structured outputs (`structured.py`) and tools
(`tools.py`).

A model id is a model name (curated name, hub id or path, as the allow-list permits), optionally
followed by `@preset` to serve it with an optimization preset, e.g. `demo@no-prefix-cache`.
Usage figures are the engine's own counts (`prompt_tokens`, `completion_tokens`, and
`prompt_tokens_details.cached_tokens` from the prefix cache); each response also carries the
engine's per-request `metrics` (TTFT, TPOT, E2EL) as an extension field. Streaming uses
server-sent events ending with `data: [DONE]`. A client that disconnects cancels its requests,
streamed or not.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
import time
import uuid
import weakref
from dataclasses import dataclass

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine import EngineConfig, EngineError, RequestError
from playground.api.admission import Admission, Ticket, client_address
from playground.api.choices import choice_seeds, parse_n, usage
from playground.api.errors import APIError
from playground.api.fields import check_fields
from playground.api.logprobs import chat_logprobs, parse_logprobs, text_logprobs, token_bytes
from playground.api.models import ModelCatalogue
from playground.api.structured import Constraint, parse_constraint
from playground.api.tools import CallStream, Tools, encode_chat, parse_tools, with_tool_turns_as_text
from playground.figures.replies import reply_figures
from playground.shared.chat_messages import MAX_MESSAGES, parse_messages
from playground.shared.configs import default_config, preset_config
from playground.shared.context import PlaygroundContext
from playground.shared.errors import Refused
from playground.shared.sampling import parse_sampling
from playground.shared.values import parse_int

MAX_PROMPTS = 16
DISCONNECT_POLL_S = 0.2
FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


@dataclass(frozen=True)
class Call:
    """What one request asks for beyond its prompts and sampling, parsed before it is admitted."""

    kind: str  # "chat" or "text"
    n: int = 1
    logprobs: int | None = None  # alternatives per token; None: no logprobs
    constraint: Constraint | None = None  # the grammar the reply must follow
    tools: Tools | None = None  # chat: the function tools and the tool choice


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
        self.settings = settings = context.settings
        self.models = ModelCatalogue(context)
        self.admission = Admission(settings.max_concurrent_chats + settings.max_queue, settings.max_tokens_in_flight,
                                   settings.max_client_tokens_in_flight)

    # ----- configuration ---------------------------------------------------------------------

    def config_for(self, model) -> EngineConfig:
        """The engine configuration of a model id (`name` or `name@preset`), validated under the hosting limits;
        404 `model_not_found` for a model that cannot be loaded here now (`models.py`)."""
        if not isinstance(model, str) or not model.strip() or len(model) > 300:
            raise APIError(400, "model must be a model id (see /v1/models)", param="model")
        name, _, preset = model.strip().partition("@")
        self.models.check(name)
        try:
            fields = preset_config(preset, name, self.context.presets) if preset else default_config(name)
            return self.context.validate(fields)
        except (EngineError, Refused) as error:
            if "not allowed" in str(error):  # a preset's draft model the allow-list forbids
                raise APIError(404, self.context.describe(error), param="model", code="model_not_found") from None
            raise APIError(400, self.context.describe(error), param="model") from None

    def engine_figures(self, config: EngineConfig) -> dict | None:
        """What a loaded engine of `config` reports about itself (None when it is not loaded: a GET loads nothing)."""
        with self.context.pool.lease_if_loaded(config) as entry:
            if entry is None:
                return None
            info = entry.engine.info
            return {key: getattr(info, key) for key in ("backend", "attention", "dtype", "device", "vocab_size",
                                                        "max_model_len", "num_params")}

    # ----- requests -------------------------------------------------------------------------

    @staticmethod
    async def _body(request: Request) -> dict:
        """The request's JSON object (its size and read time are bounded by `http_limits.BodyLimits`)."""
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deeply to read
            raise APIError(400, "the request body must be JSON") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        return body

    @staticmethod
    def _check_fields(body: dict, kind: str) -> None:
        check_fields(body, kind)
        if not isinstance(body.get("stream", False), bool):
            raise APIError(400, "stream must be true or false", param="stream")
        options = body.get("stream_options")
        if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}
                                    or not isinstance(options.get("include_usage", False), bool)):
            raise APIError(400, "stream_options may only hold include_usage (true or false)", param="stream_options")

    @staticmethod
    def _max_tokens(body: dict) -> tuple[str, object]:
        """(field, value) of the token budget asked for: `max_completion_tokens`, else `max_tokens` (value None
        when neither is set)."""
        if body.get("max_completion_tokens") is not None:
            return "max_completion_tokens", body["max_completion_tokens"]
        return "max_tokens", body.get("max_tokens")

    def _sampling(self, body: dict, prompt_tokens: list[int], max_model_len: int, kind: str):
        budget_field, max_tokens = self._max_tokens(body)
        longest = max(len(ids) for ids in prompt_tokens)
        if max_tokens is None:
            max_tokens = max(1, min(self.settings.max_new_tokens, max_model_len - longest))
        try:
            params = parse_sampling(self.settings, max_tokens, body.get("temperature", 1.0), body.get("top_p", 1.0),
                                    body.get("top_k", 0), body.get("seed"), body.get("stop"),
                                    body.get("ignore_eos", False))
        except Refused as refusal:
            raise APIError(400, str(refusal), param=budget_field if refusal.field == "max_tokens" else refusal.field
                           ) from None
        if longest + params.max_tokens > max_model_len:
            what = "messages" if kind == "chat" else "prompt"
            raise APIError(400, f"this model's maximum context length is {max_model_len} tokens; this request asks "
                                f"for {longest + params.max_tokens} ({longest} in the {what}, {params.max_tokens} in "
                                "the completion): shorten the prompt or lower max_tokens",
                           param=what, code="context_length_exceeded")
        return params

    def _messages(self, messages) -> list[dict]:
        settings = self.settings
        try:
            return parse_messages(messages, MAX_MESSAGES, settings.max_message_chars, settings.max_conversation_chars)
        except Refused as refusal:
            raise APIError.refused(refusal) from None

    def _prompts(self, prompt) -> list:
        prompts = [prompt] if isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                                          and all(isinstance(t, int) for t in prompt)) else prompt
        if not isinstance(prompts, list) or not prompts or len(prompts) > MAX_PROMPTS:
            raise APIError(400, f"prompt must be a string, a list of token ids, or a list of 1 to {MAX_PROMPTS} "
                                "of those", param="prompt")
        total = 0
        for item in prompts:
            is_ids = isinstance(item, list) and item and all(isinstance(t, int) and not isinstance(t, bool)
                                                             for t in item)
            if not (isinstance(item, str) or is_ids):
                raise APIError(400, "each prompt must be a string or a non-empty list of token ids", param="prompt")
            if len(item) > self.settings.max_message_chars:
                raise APIError(400, f"a prompt may be at most {self.settings.max_message_chars:,} characters or "
                                    "tokens (PLAYGROUND_MAX_MESSAGE_CHARS)", param="prompt")
            total += len(item)
        if total > self.settings.max_conversation_chars:
            raise APIError(400, f"the prompts are over {self.settings.max_conversation_chars:,} characters or tokens "
                                "in all, this server's limit (PLAYGROUND_MAX_CONVERSATION_CHARS)", param="prompt")
        return prompts

    def _call(self, body: dict, kind: str) -> Call:
        """What the call asks for beyond prompts and sampling; one grammar at most (a forced tool call's or the
        reply format's)."""
        tools = parse_tools(body) if kind == "chat" else None
        constraint, forced = parse_constraint(body), tools and tools.constraint()
        if constraint and forced:
            raise APIError(400, f"a forced tool call and {constraint.field} both constrain the reply; send one",
                           param="tool_choice")
        return Call(kind, parse_n(body), parse_logprobs(body, kind, self.settings.max_top_logprobs),
                    constraint or forced, tools)

    def _admit(self, request: Request, body: dict, sequences: int) -> Ticket:
        """A place among the calls in flight, holding the tokens the call's `sequences` (prompts x n) may generate
        (before anything is tokenised: an explicit max_tokens, checked, else the server's cap)."""
        budget_field, asked = self._max_tokens(body)
        try:
            max_tokens = self.settings.max_new_tokens if asked is None else parse_int(budget_field, asked, 1)
        except Refused as refusal:
            raise APIError.refused(refusal) from None
        tokens = sequences * min(max_tokens, self.settings.max_new_tokens)
        return self.admission.admit(client_address(request, self.settings.client_address_header), tokens)

    def _start(self, body: dict, prompts: list, call: Call, ticket: Ticket) -> tuple[_Job, dict]:
        """Lease the engine, encode every prompt, check the limits, submit; runs in a worker thread.

        On success the returned job owns the call's ticket; on failure the ticket is given back.
        """
        try:
            return self._submit(body, prompts, call, ticket)
        except BaseException:
            self.admission.leave(ticket)
            raise

    def _submit(self, body: dict, prompts: list, call: Call, ticket: Ticket) -> tuple[_Job, dict]:
        config, kind = self.config_for(body.get("model")), call.kind
        try:
            entry = self.context.pool.acquire(config)
        except Exception as error:  # a load that failed or is over budget: the caller's problem to report
            raise APIError(503 if not isinstance(error, EngineError | Refused) else 400,
                           self.context.describe(error), kind="server_error"
                           if not isinstance(error, EngineError | Refused) else "invalid_request_error") from None
        job = _Job(self.context.pool, entry, on_close=lambda: None)
        what = "messages" if kind == "chat" else "prompt"
        try:
            engine = job.engine
            max_model_len = engine.info.max_model_len
            try:
                ids = [encode_chat(engine, prompt, call.tools) if kind == "chat" else engine.encode(prompt)
                       for prompt in prompts]
            except RequestError as error:
                raise APIError(400, self.context.describe(error), param=what,
                               code="context_length_exceeded" if "max_model_len" in str(error) else None) from None
            longest = max(len(i) for i in ids)
            if longest > self.settings.max_prompt_tokens:
                raise APIError(400, f"the prompt is {longest} tokens; this server allows "
                                    f"{self.settings.max_prompt_tokens} (PLAYGROUND_MAX_PROMPT_TOKENS)", param=what,
                               code="context_length_exceeded")
            params = dataclasses.replace(self._sampling(body, ids, max_model_len, kind), logprobs=call.logprobs,
                                         guided=self._checked(engine, call.constraint))
            if call.logprobs is not None and engine.tokenizer is None:
                raise APIError(400, "this model has no tokenizer, so its tokens have no text to report logprobs of",
                               param="logprobs")
            speculative = config.speculative != "off"
            job.handles = [engine.submit(prompt_ids, dataclasses.replace(params, seed=seed))
                           for prompt_ids in ids for seed in choice_seeds(params.seed, call.n)]
        except BaseException:
            job.close()
            raise
        job.on_close = lambda: self.admission.leave(ticket)
        return job, {"speculative": speculative}

    def _checked(self, engine, constraint: Constraint | None):
        """The constraint's GuidedDecoding, compiled (cached, time-bounded) before anything is queued; a 400
        naming its field when the engine cannot enforce it."""
        if constraint is None:
            return None
        try:
            engine.check_guided(constraint.guided)
        except RequestError as error:
            raise APIError(400, f"{constraint.field}: {self.context.describe(error)}", param=constraint.field) from None
        return constraint.guided

    async def _outputs(self, request: Request, job: _Job) -> list | None:
        """Every request's output; None when the client went away first (its requests are cancelled at once)."""
        gone = False
        async with anyio.create_task_group() as group:
            async def watch() -> None:
                nonlocal gone
                while not await request.is_disconnected():
                    await anyio.sleep(DISCONNECT_POLL_S)
                gone = True
                job.close()  # cancels what still runs: the outputs below come back at once

            group.start_soon(watch)
            outputs = await anyio.to_thread.run_sync(lambda: [handle.result() for handle in job.handles])
            group.cancel_scope.cancel()
        return None if gone else outputs

    # ----- responses ------------------------------------------------------------------------

    async def respond(self, request: Request, kind: str):
        """One `/v1/chat/completions` (kind "chat") or `/v1/completions` (kind "text") request."""
        try:
            body = await self._body(request)
            self._check_fields(body, kind)
            call = self._call(body, kind)
            prompts = ([self._messages(with_tool_turns_as_text(body.get("messages")))]
                       if kind == "chat" else self._prompts(body.get("prompt")))
            ticket = self._admit(request, body, len(prompts) * call.n)
        except APIError as error:
            return error.response()
        try:
            job, extra = await anyio.to_thread.run_sync(self._start, body, prompts, call, ticket)
        except APIError as error:
            return error.response()
        meta = {"id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}", "created": int(time.time()),
                "model": body["model"]}
        if not body.get("stream", False):
            try:
                outputs = await self._outputs(request, job)
            finally:
                job.close()
            if outputs is None:
                return APIError(499, "the client closed the connection", code="client_closed_request").response()
            return self._complete(call, meta, job, outputs, extra["speculative"])
        options = body.get("stream_options") or {}
        events = self._events(call, meta, job, extra["speculative"], options.get("include_usage", False))
        weakref.finalize(events, job.close)  # a stream that never starts still returns its lease and place
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @staticmethod
    def _logprobs(call: Call, job: _Job, entries: list, offset: int = 0) -> dict | None:
        """A choice's (or a chunk's) `logprobs` in the route's format; None when the call did not ask."""
        if call.logprobs is None:
            return None
        to_bytes = token_bytes(job.engine.tokenizer)
        return chat_logprobs(entries, to_bytes) if call.kind == "chat" else text_logprobs(entries, to_bytes, offset)

    @staticmethod
    def _tool_call(call: Call, text: str, finish_reason: str) -> dict | None:
        """The reply as a tool call, when the call showed tools and the reply is one (never a reply cut short)."""
        if call.tools is None or not call.tools.shown or finish_reason == "length":
            return None
        return call.tools.call_of(text)

    def _complete(self, call: Call, meta: dict, job: _Job, outputs: list, speculative: bool) -> JSONResponse:
        kind = call.kind
        failed = [o for o in outputs if o.finish_reason == "error"]
        if failed:
            return APIError(500, f"the engine failed this request: {failed[0].error}", kind="server_error").response()
        choices = []
        for index, output in enumerate(outputs):
            choice = {"index": index, "finish_reason": FINISH.get(output.finish_reason, "stop"),
                      "logprobs": self._logprobs(call, job, output.logprobs or [])}
            tool_call = self._tool_call(call, output.text, output.finish_reason)
            if tool_call:
                choice["message"] = {"role": "assistant", "content": None, "tool_calls": [tool_call]}
                choice["finish_reason"] = "tool_calls"
            elif kind == "chat":
                choice["message"] = {"role": "assistant", "content": output.text}
            else:
                choice["text"] = output.text
            choices.append(choice)
        return JSONResponse({**meta, "object": "chat.completion" if kind == "chat" else "text_completion",
                             "choices": choices, "usage": usage([o.metrics for o in outputs], call.n),
                             "metrics": [reply_figures(o.metrics, speculative) for o in outputs]})

    async def _events(self, call: Call, meta: dict, job: _Job, speculative: bool, include_usage: bool):
        """Server-sent events: one chunk per engine delta, a final chunk per choice, usage if asked, [DONE]."""
        kind = call.kind
        chunk_type = "chat.completion.chunk" if kind == "chat" else "text_completion"
        deltas: queue.Queue = queue.Queue()

        def pump(index: int, handle) -> None:
            for delta in handle:
                deltas.put((index, delta))

        for index, handle in enumerate(job.handles):
            threading.Thread(target=pump, args=(index, handle), name="openai-stream", daemon=True).start()

        offsets = [0] * len(job.handles)  # characters of each choice's tokens streamed so far (text_offset)

        shown = call.tools is not None and call.tools.shown
        held = [CallStream(call.tools) if shown else None for _ in job.handles]  # text that may yet be a call

        def chunk(index: int, text: str | None, finish: str | None, first: bool = False, entries=(),
                  tool_call: dict | None = None) -> str:
            logprobs = self._logprobs(call, job, list(entries), offsets[index]) if entries else None
            if logprobs and kind == "text":
                offsets[index] += sum(len(token) for token in logprobs["tokens"])
            if tool_call:
                delta = {"tool_calls": [{"index": 0, **tool_call}]}
                choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
            elif kind == "chat":
                delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
                choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
            else:
                choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
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
                text = held[index].feed(delta.text) if held[index] else delta.text
                if text or delta.logprobs:
                    yield chunk(index, text, None, entries=delta.logprobs)
                if delta.finished:
                    finished += 1
                    metrics[index] = delta.metrics
                    finish = FINISH.get(delta.finish_reason, "stop")
                    if held[index]:
                        rest, tool_call = held[index].finish(cut=delta.finish_reason == "length")
                        if rest:
                            yield chunk(index, rest, None)
                        if tool_call:
                            yield chunk(index, None, None, tool_call=tool_call)
                            finish = "tool_calls"
                    yield chunk(index, None, finish)
            if include_usage:
                ordered = [metrics[i] for i in range(len(job.handles))]
                last = {**meta, "object": chunk_type, "choices": [], "usage": usage(ordered, call.n),
                         "metrics": [reply_figures(m, speculative) for m in ordered]}
                yield f"data: {json.dumps(last)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            job.close()


def build_router(service: OpenAIService) -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                            "owned_by": "inference-playground"} for name in service.models.listed()]}

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

    served = {route.path: route.methods for route in router.routes}

    # Last, so that it matches only what no route above serves: OpenAI's error format rather than FastAPI's.
    @router.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
    def unknown(path: str, request: Request):
        known = served.get(f"/v1/{path}")
        if known:
            return APIError(405, f"/v1/{path} takes {', '.join(sorted(known))}, not {request.method}",
                            code="method_not_allowed").response()
        return APIError(404, f"this server has no /v1/{path}: it serves /v1/models, /v1/chat/completions and "
                             "/v1/completions", code="unknown_url").response()

    return router


def openai_routes(context: PlaygroundContext) -> list:
    """The /v1 routes, for the server Gradio runs (they share its process, port and engine pool)."""
    return list(build_router(OpenAIService(context)).routes)
