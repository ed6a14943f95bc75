"""Compare's "chat with both": one message to every side of the comparison, each reply streaming in its own
conversation and column.

Why apart from the comparison: a chat is not measured. It sends to one side at a time (the first side
alternates per message, as a comparison's rounds do), fits each side's history to that side's engine
the way the chat tab does, and Stop ends the reply in flight and skips the sides still waiting. A side with
structured output gets its reply's validity and mask figures, as the chat tab's replies do.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict

from playground.compare.request import Side
from playground.figures.configuration import config_summary
from playground.figures.replies import reply_figures
from playground.figures.validity import reply_validity
from playground.shared.context import PlaygroundContext
from playground.shared.conversation import Conversation, Exchange, fit_exchange
from playground.shared.session import Session


class ChatWithBoth:
    """Chats with every side of a comparison, over the context's pool."""

    def __init__(self, context: PlaygroundContext):
        self.context = context

    def _reply(self, side: Side, conversation: Conversation, exchange: Exchange, params,
               session: Session) -> Iterator[None]:
        """Stream one side's reply to the newest exchange of its conversation (yielding as text arrives)."""
        config, params = side.config, side.sampling(params)
        speculative, guided = config.speculative != "off", side.guided is not None
        with self.context.pool.lease(config) as entry:
            engine = entry.engine
            settings = self.context.settings
            fitted = fit_exchange(engine, conversation, len(conversation.exchanges) - 1, params.max_tokens,
                                  settings.max_prompt_tokens, settings.max_conversation_chars)
            exchange.dropped_turns = fitted.dropped_turns
            exchange.config = f"{side.label} · {config_summary(config, engine.info)}"
            stream = engine.stream(fitted.token_ids, params)
            last = 0.0
            try:
                for delta in stream:
                    exchange.reply += delta.text
                    exchange.figures = reply_figures(delta.metrics, speculative, guided)
                    if delta.finished:  # shown by the caller once the reply is complete (its validity included)
                        exchange.finish_reason, exchange.error = delta.finish_reason, delta.error
                    elif session.compare.chat_stop:
                        break
                    elif time.perf_counter() - last > 0.05:
                        last = time.perf_counter()
                        yield
            finally:
                stream.close()
                if exchange.finish_reason is None:
                    exchange.finish_reason = "cancelled"
                if guided:
                    exchange.validity = asdict(reply_validity(side.guided.kind, side.guided.spec, exchange.reply,
                                                              exchange.finish_reason))

    def send(self, message: str, sides: tuple[Side, ...], params, session: Session) -> Iterator[None]:
        """Send `message` to every side, one side at a time (the first side alternates per message)."""
        state = session.compare
        for side in sides:
            state.chats.setdefault(side.label, Conversation())
        turn = len(state.chats[sides[0].label].exchanges)
        order = sides if turn % 2 == 0 else tuple(reversed(sides))
        state.chat_stop, state.chat_streaming = False, True
        try:
            for side in order:
                conversation = state.chats[side.label]
                exchange = Exchange(user=message)
                conversation.exchanges.append(exchange)
                if state.chat_stop:
                    exchange.finish_reason = "cancelled"
                    continue
                try:
                    yield from self._reply(side, conversation, exchange, params, session)
                except Exception as error:  # refused, over budget, failed to load: the reply says why
                    exchange.finish_reason, exchange.error = "error", self.context.describe(error)
                yield
        finally:
            state.chat_streaming = False
