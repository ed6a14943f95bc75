"""Keeping a chat's history within the server's prompt limit.

Why: a long conversation grows its prompt every turn; on a public server the prompt is capped
(PLAYGROUND_MAX_PROMPT_TOKENS). The oldest turns are dropped first (a system message stays);
a single message that is still too long is refused with a clear reason.
"""

from __future__ import annotations

from collections.abc import Callable


class PromptTooLong(ValueError):
    """The newest message alone is over the prompt limit."""


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def as_prompt(tokenizer, messages: list[dict]) -> list[dict] | str:
    """What to send the engine: the messages (rendered with the chat template by the engine), or,
    for a model without a chat template, a plain transcript ending where the assistant speaks."""
    if has_chat_template(tokenizer):
        return messages
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nAssistant:"


def count_prompt_tokens(tokenizer, messages: list[dict]) -> int:
    """Tokens of the prompt `as_prompt` builds, counted the way the engine encodes it."""
    prompt = as_prompt(tokenizer, messages)
    if isinstance(prompt, str):
        return len(tokenizer.encode(prompt))
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return len(tokenizer.encode(text, add_special_tokens=False))


def fit_history(messages: list[dict], count_tokens: Callable[[list[dict]], int], limit: int) -> list[dict]:
    """Drop the oldest non-system messages until the rendered prompt fits in `limit` tokens."""
    system = [m for m in messages[:1] if m["role"] == "system"]
    rest = messages[len(system):]
    while True:
        candidate = system + rest
        tokens = count_tokens(candidate)
        if tokens <= limit:
            return candidate
        if len(rest) <= 1:
            raise PromptTooLong(f"the message is {tokens} tokens with the chat template; this server allows "
                                f"{limit} prompt tokens (PLAYGROUND_MAX_PROMPT_TOKENS)")
        rest = rest[2:] if rest[0]["role"] == "user" and len(rest) > 2 else rest[1:]
