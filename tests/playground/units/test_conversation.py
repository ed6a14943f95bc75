"""Conversations: history fitted to the loaded engine's context, exports and the browser's copy checked on restore."""

from __future__ import annotations

import json

import pytest

from engine import RequestError, RequestMetrics
from playground.figures.conversation_views import conversation_markdown
from playground.figures.replies import reply_figures
from playground.shared.conversation import Conversation, Exchange, PromptTooLong, fit_prompt
from playground.shared.errors import Refused


def word_encoder(calls: list):
    """A stand-in for Engine.encode: one token per word of the rendered chat; raises past 100 tokens."""

    def encode(prompt):
        calls.append(prompt)
        ids = [1] * sum(len(m["content"].split()) + 2 for m in prompt)
        if len(ids) >= 100:
            raise RequestError(f"the prompt is {len(ids)} tokens but max_model_len is 100")
        return ids

    return encode


def test_history_is_trimmed_to_the_loaded_engines_context_minus_the_reply_budget():
    pairs = [(f"question {i} " + "word " * 8, f"answer {i} " + "word " * 8) for i in range(12)]
    calls = []
    fitted = fit_prompt(word_encoder(calls), True, "be brief", pairs, "the newest question", max_model_len=100,
                        max_tokens=40, max_prompt_tokens=4096)
    # 2 pairs of 24 tokens + system 4 + question 5 = 57 <= 100 - 40; 3 pairs would be 81
    assert fitted.dropped_turns == 10 and len(fitted.token_ids) == 57 and fitted.reply_room == 43
    assert len(calls) <= 5, "fitting should take O(log turns) encodings"
    chosen = next(c for c in calls if len(c) == 2 + 2 * 2)
    assert chosen[0]["content"] == "be brief" and chosen[1]["content"].startswith("question 10")
    assert chosen[-1]["content"] == "the newest question"


def test_a_long_history_is_cut_in_characters_before_anything_is_encoded():
    """A session keeps up to 100 turns of up to PLAYGROUND_MAX_MESSAGE_CHARS each: far more text than any prompt.
    Turns beyond max_chars characters are left out before encoding, so no encoding sees more than that."""
    pairs = [("question " + "word " * 400, "answer " + "word " * 400) for _ in range(100)]  # ~4,000 characters each
    calls = []
    fitted = fit_prompt(word_encoder(calls), True, "be brief", pairs, "the newest question", max_model_len=100,
                        max_tokens=40, max_prompt_tokens=4096, max_chars=10_000)
    assert fitted.dropped_turns == 100 and calls
    assert max(sum(len(m["content"]) for m in prompt) for prompt in calls) <= 10_000
    kept = fit_prompt(word_encoder([]), True, "", [("a", "b")] * 3, "new", max_model_len=100, max_tokens=8,
                      max_prompt_tokens=4096, max_chars=5)  # "new" + one turn of 2 characters fit in 5
    assert kept.dropped_turns == 2


def test_the_newest_turn_is_kept_even_when_it_leaves_less_room_than_max_tokens():
    fitted = fit_prompt(word_encoder([]), True, "", [("old " * 10, "reply " * 10)], "new " * 50,
                        max_model_len=100, max_tokens=80, max_prompt_tokens=4096)
    assert fitted.dropped_turns == 1 and len(fitted.token_ids) == 52 and fitted.reply_room == 48
    with pytest.raises(PromptTooLong, match="PLAYGROUND_MAX_PROMPT_TOKENS"):
        fit_prompt(word_encoder([]), True, "", [], "new " * 50, max_model_len=100, max_tokens=8, max_prompt_tokens=30)
    with pytest.raises(RequestError, match="max_model_len"):
        fit_prompt(word_encoder([]), True, "", [], "new " * 120, max_model_len=100, max_tokens=8,
                   max_prompt_tokens=4096)


def test_conversation_exports_and_restores_only_well_formed_copies():
    figures = reply_figures(RequestMetrics.from_timestamps(10.0, [10.2, 10.3], 12, 8), speculative=False)
    conversation = Conversation("be brief", [Exchange("hi", "hello", figures, "stop", visible_ttft_ms=900.0,
                                                      config="demo · native"), Exchange("still streaming")])
    data = json.loads(conversation.to_json())
    assert len(data["exchanges"]) == 1  # an unfinished reply is not exported
    restored = Conversation.from_dict(data, max_message_chars=100)
    assert restored.exchanges[0].reply == "hello" and restored.history_pairs() == [("hi", "hello")]
    markdown = conversation_markdown(conversation)
    assert "engine TTFT 200 ms" in markdown and "Enter → first text 900 ms" in markdown and "be brief" in markdown
    for broken in ({"format": "x"}, {**data, "exchanges": "no"},
                   {**data, "exchanges": [{**data["exchanges"][0], "user": "x" * 101}]},
                   {**data, "exchanges": [{**data["exchanges"][0], "finish_reason": "exploded"}]},
                   {**data, "exchanges": [{**data["exchanges"][0], "figures": {"engine_ttft_ms": "fast"}}]}):
        with pytest.raises(Refused):
            Conversation.from_dict(broken, max_message_chars=100)


def test_failed_and_empty_replies_are_not_history():
    conversation = Conversation("", [Exchange("a", "x", finish_reason="stop"),
                                     Exchange("b", "y", finish_reason="error"),
                                     Exchange("c", "", finish_reason="cancelled")])
    assert conversation.history_pairs() == [("a", "x")]
