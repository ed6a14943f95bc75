"""The chat's handlers: send, regenerate, edit and resend, undo, clear, stop, export, and the `/chat` API.

Why apart from the panel: a reply has its own life (fit the history to the loaded engine, stream,
record figures, keep the browser's copy of the conversation) shared by every way a reply starts.
`_stream_reply` is that life, once; the handlers differ only in which exchange they send.

What is refused (an empty or oversized message, bad sampling values, a prompt that cannot fit)
never enters the conversation: the message goes back to the text box and the notice says why.
"""

from __future__ import annotations

import html
import itertools
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import gradio as gr

from engine import EngineError
from playground.chat.charts import CHART_NAMES, LiveCharts, ttft_chart
from playground.chat.measure import DEFAULT_REPEATS, measure_prompt
from playground.figures.configuration import config_tag
from playground.figures.conversation_views import conversation_markdown, render_chat
from playground.figures.replies import reply_figures
from playground.figures.token_view import reply_tokens
from playground.figures.validity import reply_validity
from playground.shared.context import PlaygroundContext
from playground.shared.conversation import MAX_KEPT_EXCHANGES, Conversation, Exchange, fit_exchange
from playground.shared.errors import Refused
from playground.shared.sampling import parse_sampling
from playground.shared.session import Session, pack
from playground.shared.structured_output import OFF, parse_structured_output
from playground.shared.zero_gpu import ZeroGpuEngine

CHART_REFRESH_S = 0.5
TEXT_REFRESH_S = 0.05
MAX_VISIBLE_LATENCY_MS = 600_000.0
STOP_WAIT_S = 30.0
CHAT_OUTPUTS = ("chatbot", "message", "session", "stored", "notice", "export_json", "export_md", *CHART_NAMES)
LATENCY_OUTPUTS = ("chatbot", "stored", "ttft_chart")
TOP_LOGPROBS = 5  # alternatives shown for each token of a reply with token probabilities


def _notice(kind: str, text: str) -> str:
    return f'<div class="chat-notice {kind}">{html.escape(text)}</div>' if text else ""


class ChatHandlers:
    """Chat handlers over the context (its pool and limits), refreshing the session's live charts."""

    def __init__(self, context: PlaygroundContext, charts: LiveCharts):
        self.context = context
        self.charts = charts
        self.settings = context.settings
        self._exports = tempfile.TemporaryDirectory(prefix="playground-exports-")

    # ----- input ---------------------------------------------------------------------------

    def _text(self, value, name: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise Refused(f"{name} must be text")
        if len(value) > self.settings.max_message_chars:
            raise Refused(f"the {name} is {len(value):,} characters; this server takes at most "
                          f"{self.settings.max_message_chars:,} (PLAYGROUND_MAX_MESSAGE_CHARS)")
        return value.strip()

    def _request(self, message, system_prompt, max_tokens, temperature, top_p, top_k, seed, stop, structured=OFF,
                 structured_spec="", token_probs=False):
        """(message, system prompt, SamplingParams), or Refused naming the first bad value. `structured` and its
        text ask for structured output (`SamplingParams.guided`), `token_probs` for each token's probability and
        its top alternatives (`SamplingParams.logprobs`)."""
        text = self._text(message, "message")
        system = self._text(system_prompt, "system prompt")
        params = parse_sampling(self.settings, max_tokens, temperature, top_p, top_k, seed, stop)
        if not isinstance(token_probs, bool):
            raise Refused("show token probabilities must be true or false")
        guided = parse_structured_output(structured, structured_spec, self.settings.max_message_chars)
        return text, system, replace(params, guided=guided, logprobs=TOP_LOGPROBS if token_probs else None)

    def measure(self, message, system_prompt, max_tokens, temperature, top_p, top_k, seed, stop, structured,
                structured_spec, token_probs, session) -> str:
        """The chat's "measure" action: the message asked DEFAULT_REPEATS times (at most the server's cap), as a
        notice with the median and range of its figures; the conversation is left as it was."""
        session = self.context.session_of(session)
        try:
            text, _, params = self._request(message, system_prompt, max_tokens, temperature, top_p, top_k, seed,
                                            stop, structured, structured_spec, token_probs)
            if not text:
                raise Refused("type a message to measure")
            repeats = min(DEFAULT_REPEATS, self.settings.max_measure_repeats)
            return _notice("info", measure_prompt(self.context, session, text, params, repeats))
        except (Refused, EngineError) as error:
            return _notice("bad", self.context.describe(error))

    # ----- one reply -------------------------------------------------------------------------

    def _stream_reply(self, session: Session, exchange: Exchange, params) -> Iterator[object]:
        """Stream the reply to `exchange` (the newest of the conversation), yielding the engine whenever
        there is something new to show. Afterwards the exchange is finished (figures, finish reason) and
        the caller shows it once: the page reports its measured wait when it sees the finished figures, and
        a second finished update, computed before that report, could arrive after it and hide it. A reply with
        structured output gets its validity, one with token probabilities its tokens, once it has ended.

        Raises Refused, with the exchange removed again, if the prompt is refused before anything
        streams (it does not fit, the model cannot chat, its engine cannot load, the engine refuses its
        structured output).
        """
        conversation = session.conversation
        index = conversation.exchanges.index(exchange)
        received = time.perf_counter()
        speculative, guided = session.config.speculative != "off", params.guided is not None
        served_elsewhere = session.config.backend == "remote"
        metrics, started, logprobs = None, False, []
        session.streaming, session.stop_requested = True, False
        try:
            with self.context.pool.lease(session.config) as entry:
                engine = entry.engine
                exchange.config = config_tag(session.config)
                fitted = fit_exchange(engine, conversation, index, params.max_tokens, self.settings.max_prompt_tokens,
                                      self.settings.max_conversation_chars)
                exchange.dropped_turns = fitted.dropped_turns
                stream = engine.stream(fitted.token_ids, params)
                session.activity.request_started(time.perf_counter())
                last_shown, first_text, counted = 0.0, None, 0
                try:
                    # The first delta submits the request: what the engine refuses at submission (a schema keyword
                    # the grammar library cannot enforce) raises here, before the reply has started. (Checking the
                    # grammar first instead would compile it outside the request, which then reports no compile.)
                    first = next(stream, None)
                    started = True
                    for delta in itertools.chain([first] if first else [], stream):
                        now = time.perf_counter()
                        exchange.reply += delta.text
                        logprobs += delta.logprobs
                        # tokens by the request's own count (a served model streams text: its count is the server's)
                        session.activity.tokens_arrived(now, delta.metrics.output_tokens - counted)
                        counted = delta.metrics.output_tokens
                        metrics = delta.metrics
                        if delta.text and first_text is None:
                            first_text = now
                        exchange.figures = {**exchange.figures,
                                            **reply_figures(metrics, speculative, guided, served_elsewhere),
                                            "first_text_ms": None if first_text is None
                                            else round((first_text - received) * 1000, 1)}
                        if delta.finished:
                            exchange.finish_reason, exchange.error = delta.finish_reason, delta.error
                        elif session.stop_requested:
                            break  # closing the stream below cancels the request
                        elif now - last_shown >= TEXT_REFRESH_S:
                            last_shown = now
                            yield engine
                finally:
                    stream.close()
                    session.activity.request_ended(time.perf_counter())
                    if isinstance(engine, ZeroGpuEngine) and (call := engine.thread_call()) is not None:
                        exchange.figures = {**exchange.figures, **call.figures()}
                    if params.logprobs is not None:
                        exchange.tokens = reply_tokens(engine.tokenizer, logprobs)
        except Exception as failure:  # before streaming: refused; during: the reply shows the error
            if not started:
                conversation.exchanges.remove(exchange)
                raise Refused(self.context.describe(failure)) from failure
            exchange.finish_reason, exchange.error = "error", self.context.describe(failure)
        finally:
            session.streaming = False
            if started:
                if exchange.finish_reason is None:  # Stop, or the generator was closed (the tab went away)
                    exchange.finish_reason = "cancelled"
                if metrics is None:
                    exchange.figures = {**exchange.figures,
                                        **reply_figures(None, speculative, guided, served_elsewhere)}
                if guided:
                    exchange.validity = asdict(reply_validity(params.guided.kind, params.guided.spec, exchange.reply,
                                                              exchange.finish_reason))
                session.turns.append(exchange)

    def _converse(self, session: Session, exchange: Exchange, params, message_back: str | None,
                  replaced: list[Exchange]) -> Iterator[tuple]:
        """Send `exchange` (after removing `replaced`, which come back if it is refused) and stream the view.

        `message_back` is the text box's text, emptied while the reply streams and put back if the
        message is refused; None leaves the text box alone (regenerate, edit).
        """
        conversation = session.conversation
        conversation.exchanges.append(exchange)
        del conversation.exchanges[:-MAX_KEPT_EXCHANGES]  # a session's memory stays bounded (the model sees less)
        del session.turns[:-MAX_KEPT_EXCHANGES]
        textbox = {} if message_back is None else {"message": ""}
        yield pack(CHAT_OUTPUTS, {"chatbot": render_chat(conversation), "session": session, "notice": "", **textbox})
        last_chart = 0.0
        try:
            for engine in self._stream_reply(session, exchange, params):
                values = {"chatbot": render_chat(conversation)}
                now = time.perf_counter()
                if now - last_chart >= CHART_REFRESH_S:
                    last_chart = now
                    values.update(zip(CHART_NAMES, self.charts.outputs(session, engine), strict=True))
                yield pack(CHAT_OUTPUTS, values)
        except Refused as refusal:
            conversation.exchanges.extend(replaced)
            textbox = {} if message_back is None else {"message": message_back}
            yield pack(CHAT_OUTPUTS, {"chatbot": render_chat(conversation), "session": session,
                                      "notice": _notice("bad", str(refusal)), **textbox})
            return
        yield pack(CHAT_OUTPUTS, self._settled(session, self._reply_notice(exchange)))

    def _reply_notice(self, exchange: Exchange) -> str:
        if exchange.dropped_turns:
            return _notice("info", f"{exchange.dropped_turns} older turn(s) left out of this reply's prompt, so that "
                                   "it fits the loaded model's context with room for the reply (max_tokens)")
        return ""

    def _settled(self, session: Session, notice: str) -> dict:
        """Everything a finished change of the conversation updates: chat, browser copy, exports, charts."""
        return {"chatbot": render_chat(session.conversation), "session": session, "notice": notice,
                "stored": session.conversation.to_dict(), **self._export_files(session),
                **dict(zip(CHART_NAMES, self.charts.outputs(session), strict=True))}

    # ----- UI handlers -----------------------------------------------------------------------

    def send(self, message, system_prompt, max_tokens, temperature, top_p, top_k, seed, stop, structured,
             structured_spec, token_probs, session):
        """Enter / Send: one new turn."""
        session = self.context.session_of(session)
        try:
            text, system, params = self._request(message, system_prompt, max_tokens, temperature, top_p, top_k,
                                                 seed, stop, structured, structured_spec, token_probs)
        except Refused as refusal:
            yield pack(CHAT_OUTPUTS, {"session": session, "notice": _notice("bad", str(refusal))})
            return
        if session.streaming:
            yield pack(CHAT_OUTPUTS, {"session": session, "notice": _notice(
                "bad", "a reply is still streaming: wait for it or press Stop, then send again")})
            return
        if not text:
            yield pack(CHAT_OUTPUTS, {"session": session})
            return
        session.conversation.system_prompt = system
        yield from self._converse(session, Exchange(user=text), params, message, [])

    def regenerate(self, system_prompt, max_tokens, temperature, top_p, top_k, seed, stop, structured,
                   structured_spec, token_probs, session):
        """The chat's retry icon: the last reply again, to the same question."""
        session = self.context.session_of(session)
        exchanges = session.conversation.exchanges
        if not exchanges or session.streaming:
            yield pack(CHAT_OUTPUTS, {"session": session, "chatbot": render_chat(session.conversation)})
            return
        yield from self._resend(session, len(exchanges) - 1, exchanges[-1].user,
                                (system_prompt, max_tokens, temperature, top_p, top_k, seed, stop, structured,
                                 structured_spec, token_probs))

    def edit(self, system_prompt, max_tokens, temperature, top_p, top_k, seed, stop, structured, structured_spec,
             token_probs, session, edit: gr.EditData):
        """Editing a question in the chat: the conversation from that turn on is replaced by the edited turn."""
        session = self.context.session_of(session)
        index = edit.index if isinstance(edit.index, int) and not isinstance(edit.index, bool) else -1
        exchanges = session.conversation.exchanges
        if index < 0 or index % 2 or index // 2 >= len(exchanges) or session.streaming:
            yield pack(CHAT_OUTPUTS, {"session": session, "chatbot": render_chat(session.conversation)})
            return
        yield from self._resend(session, index // 2, edit.value,
                                (system_prompt, max_tokens, temperature, top_p, top_k, seed, stop, structured,
                                 structured_spec, token_probs))

    def _resend(self, session: Session, index: int, question, controls: tuple) -> Iterator[tuple]:
        try:
            text, system, params = self._request(question, *controls)
            if not text:
                raise Refused("the message is empty")
        except Refused as refusal:
            yield pack(CHAT_OUTPUTS, {"session": session, "chatbot": render_chat(session.conversation),
                                      "notice": _notice("bad", str(refusal))})
            return
        conversation = session.conversation
        replaced = conversation.exchanges[index:]
        del conversation.exchanges[index:]
        conversation.system_prompt = system
        yield from self._converse(session, Exchange(user=text), params, None, replaced)

    def undo(self, session) -> tuple:
        """The chat's undo icon: remove the last turn and put its question back in the text box."""
        session = self.context.session_of(session)
        exchanges = session.conversation.exchanges
        if not exchanges or session.streaming:
            return pack(CHAT_OUTPUTS, {"session": session, "chatbot": render_chat(session.conversation)})
        last = exchanges.pop()
        return pack(CHAT_OUTPUTS, {**self._settled(session, ""), "message": last.user})

    def clear(self, session) -> tuple:
        """Clear chat and the chat's trash icon: the display and what the model sees, both emptied."""
        session = self.context.session_of(session)
        session.conversation = Conversation(system_prompt=session.conversation.system_prompt)
        return pack(CHAT_OUTPUTS, self._settled(session, ""))

    def request_stop(self, session) -> None:
        """Stop: the streaming reply of this session ends at its next delta (whatever Gradio's cancel does)."""
        if isinstance(session, Session) and session.streaming:
            session.stop_requested = True

    def stopped(self, session) -> tuple:
        """After Stop: the reply as it was when its request was cancelled, with its figures.

        Gradio closes the reply's generator once its current step returns, which on a busy server can
        take a while; the cancelled reply is shown as soon as it has ended (the generator can no longer
        show it itself).
        """
        session = self.context.session_of(session)
        deadline = time.monotonic() + STOP_WAIT_S
        while session.streaming and time.monotonic() < deadline:
            time.sleep(0.02)
        return pack(CHAT_OUTPUTS, self._settled(session, ""))

    def example(self, sample) -> str:
        """A clicked example question (the model's `examples`), as the message to send."""
        if isinstance(sample, list | tuple) and sample and isinstance(sample[0], str):
            return sample[0][: self.settings.max_message_chars]
        return ""

    def record_visible_latency(self, value, session) -> tuple:
        """The page measured Enter -> first visible text of the newest reply; keep it with that reply's figures."""
        session = self.context.session_of(session)
        try:
            milliseconds = float(value)
        except (TypeError, ValueError):
            return pack(LATENCY_OUTPUTS, {})
        exchanges = session.conversation.exchanges
        if not exchanges or not 0 <= milliseconds <= MAX_VISIBLE_LATENCY_MS:
            return pack(LATENCY_OUTPUTS, {})
        newest = exchanges[-1]
        newest.visible_ttft_ms = round(milliseconds, 1)
        if not newest.done:  # the stream shows it with its next update
            return pack(LATENCY_OUTPUTS, {})
        return pack(LATENCY_OUTPUTS, {"chatbot": render_chat(session.conversation),
                                      "stored": session.conversation.to_dict(), "ttft_chart": ttft_chart(session)})

    def restore(self, session: Session, stored) -> dict:
        """Page load: the conversation this browser kept, if it is one (checked like any input), and its replies on
        the TTFT chart."""
        if not stored or session.conversation.exchanges:
            values = {"chatbot": render_chat(session.conversation)}
        else:
            try:
                session.conversation = Conversation.from_dict(stored, self.settings.max_message_chars)
                session.turns = [e for e in session.conversation.exchanges if e.done]  # their rows on the TTFT chart
                count = len(session.conversation.exchanges)
                values = {"chatbot": render_chat(session.conversation),
                          "notice": _notice("info", f"restored {count} turn(s) kept by this browser") if count else ""}
            except Refused:
                values = {"chatbot": [], "stored": None,
                          "notice": _notice("bad", "the conversation kept by this browser could not be read; "
                                                   "starting a new one")}
        return {**values, "system_prompt": session.conversation.system_prompt, **self._export_files(session)}

    def _export_files(self, session: Session) -> dict:
        """The conversation as JSON and Markdown files for the two download buttons (None while empty)."""
        for old in session.export_paths:
            Path(old).unlink(missing_ok=True)
        session.export_paths = []
        if not any(e.done for e in session.conversation.exchanges):
            return {"export_json": gr.DownloadButton(value=None, interactive=False),
                    "export_md": gr.DownloadButton(value=None, interactive=False)}
        folder = Path(self._exports.name) / uuid.uuid4().hex
        folder.mkdir()
        paths = {"export_json": folder / "conversation.json", "export_md": folder / "conversation.md"}
        paths["export_json"].write_text(session.conversation.to_json(), encoding="utf-8")
        paths["export_md"].write_text(conversation_markdown(session.conversation), encoding="utf-8")
        session.export_paths = [str(p) for p in paths.values()]
        return {name: gr.DownloadButton(value=str(path), interactive=True) for name, path in paths.items()}

    # ----- API handlers ----------------------------------------------------------------------

    def api_chat(self, message, system_prompt, max_tokens, temperature, top_p, top_k, seed, stop, session):
        """`/chat` for API clients: streams (reply text so far, figures); plain text, no markup.

        The conversation continues across calls of the same client (its session), like the chat box.
        """
        session = self.context.session_of(session)
        try:
            text, system, params = self._request(message, system_prompt, max_tokens, temperature, top_p, top_k,
                                                 seed, stop)
            if not text:
                raise Refused("the message is empty")
            if session.streaming:
                raise Refused("this session is already generating a reply")
        except Refused as refusal:
            raise gr.Error(str(refusal), print_exception=False) from None
        session.conversation.system_prompt = system
        exchange = Exchange(user=text)
        session.conversation.exchanges.append(exchange)
        try:
            for _ in self._stream_reply(session, exchange, params):
                yield exchange.reply, self.api_figures(exchange)
        except Refused as refusal:
            raise gr.Error(str(refusal), print_exception=False) from None
        yield exchange.reply, self.api_figures(exchange)

    @staticmethod
    def api_figures(exchange: Exchange) -> dict:
        figures = {**exchange.figures, "finish_reason": exchange.finish_reason,
                   "dropped_turns": exchange.dropped_turns, "config": exchange.config}
        if exchange.error:
            figures["error"] = exchange.error
        return figures

    def api_clear(self, session) -> str:
        """`/clear`: forget this client's conversation."""
        self.clear(session)
        return "cleared"

    def api_export(self, session) -> tuple[str, str]:
        """`/export`: this client's conversation as (JSON, Markdown) text."""
        conversation = self.context.session_of(session).conversation
        return conversation.to_json(), conversation_markdown(conversation)
