"""The chat with structured output and token probabilities on a real engine (a tiny random chat model): what the
grammar library refuses is one notice that loses nothing, and a structured reply comes back valid, with its
measured mask figures and, asked for, its tokens."""

from __future__ import annotations

import json

import pytest

from playground.app import create_playground
from playground.chat.handlers import CHAT_OUTPUTS
from playground.page import PageHandlers
from playground.shared.settings import Settings

SAMPLING = ("", 8, 0.0, 1.0, 0, "", [])  # system prompt, max_tokens, temperature, top_p, top_k, seed, stop


@pytest.fixture(scope="module")
def chat_app(tiny_chat_dir):
    context = create_playground(Settings(), default_model=tiny_chat_dir, models={})
    yield PageHandlers(context)
    context.pool.close()


def last(updates) -> dict:
    *_, final = updates
    return dict(zip(CHAT_OUTPUTS, final, strict=True))


def test_a_schema_the_grammar_library_refuses_is_one_notice_and_nothing_is_lost(chat_app):
    session = chat_app.context.new_session()
    unique = json.dumps({"type": "array", "uniqueItems": True})
    shown = last(chat_app.chat.send("list them", *SAMPLING, "JSON schema", unique, False, session))
    assert "uniqueItems" in shown["notice"] and shown["message"] == "list them"
    assert session.conversation.exchanges == [] and not session.streaming

    shown = last(chat_app.chat.send("yes or no?", *SAMPLING, "regex", "(yes|no)", True, session))
    reply = session.conversation.exchanges[-1]
    assert reply.reply in ("yes", "no") and reply.finish_reason == "stop", "the engine kept serving"
    assert reply.validity == {"valid": True, "text": "✓ matches the regex"}
    assert reply.figures["guided_mask_ms"] > 0 and "guided mask" in shown["chatbot"][-1]["content"]
    assert reply.figures["guided_compile_ms"] > 0, "its first use compiled the regex, inside the request"
    assert "".join(token.text for token in reply.tokens) == reply.reply
    assert 'class="token-view"' in shown["chatbot"][-1]["content"]
    assert "tokens" not in session.conversation.to_dict()["exchanges"][0], "the token view stays out of the export"
