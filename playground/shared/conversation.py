"""A conversation as the playground keeps it: turns with their replies and per-reply figures.

Why: one record serves every view of a chat. The model sees the system prompt and the finished
turns, trimmed to what the loaded engine can take (`fit_prompt`, `fit_exchange`); the chat box and
the exports show every turn with its figures (`playground/figures/conversation_views.py`); the
copy kept in the browser (restored after a page reload) is its `to_dict`. A restored copy comes
from the browser, so `from_dict` checks it like any other input.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from engine import RequestError
from playground.shared.errors import Refused

EXPORT_FORMAT = "inference-playground-conversation/1"
MAX_KEPT_EXCHANGES = 100
MAX_REPLY_CHARS = 100_000
MAX_LABEL_CHARS = 300
FIGURE_KEYS = ("engine_ttft_ms", "first_text_ms", "decode_tokens_per_s", "tpot_ms", "e2el_ms",
               "prompt_tokens", "cached_tokens", "output_tokens", "spec_acceptance", "spec_accepted",
               "spec_proposed", "spec_tokens_per_step", "guided_mask_ms", "guided_mask_share", "guided_compile_ms")


class PromptTooLong(Refused):
    """The newest message alone does not fit the engine's context or the server's prompt cap."""


@dataclass(eq=False)
class Exchange:
    """One user message and the reply to it, with the reply's figures and the configuration that served it."""

    user: str
    reply: str = ""
    figures: dict = field(default_factory=dict)
    finish_reason: str | None = None  # None while the reply streams
    error: str | None = None
    config: str = ""
    dropped_turns: int = 0  # older turns left out of this reply's prompt to fit the context
    # Measured by the page (Enter -> first text on screen). Kept apart from `figures`, which the streaming
    # thread replaces at every delta, so that neither writer can undo the other's update.
    visible_ttft_ms: float | None = None
    # A reply sent with structured output: whether it is what was asked for ({"valid": bool, "text": the line}).
    validity: dict | None = None
    # A reply sent with token probabilities: its tokens (playground/figures/token_view.py). Kept for the page's
    # life only, not in the browser's copy or the exports (five alternatives per token would crowd both out).
    tokens: list | None = None

    def saved(self) -> dict:
        """What the browser's copy and the JSON export keep of this exchange (all but its tokens)."""
        return {item.name: copy.deepcopy(getattr(self, item.name)) for item in fields(self) if item.name != "tokens"}

    @property
    def shown_figures(self) -> dict:
        """Every figure of the reply, the page's measurement included."""
        return {**self.figures, "visible_ttft_ms": self.visible_ttft_ms}

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def counts_as_history(self) -> bool:
        """Whether the model sees this turn in later prompts (finished with text, not failed)."""
        return self.done and self.finish_reason != "error" and bool(self.reply)


@dataclass
class Conversation:
    """A system prompt and the exchanges of one chat, oldest first."""

    system_prompt: str = ""
    exchanges: list[Exchange] = field(default_factory=list)

    def history_pairs(self, before: int | None = None) -> list[tuple[str, str]]:
        """(user, reply) of the turns the model sees, among the exchanges before index `before`."""
        kept = self.exchanges[:before] if before is not None else self.exchanges
        return [(e.user, e.reply) for e in kept if e.counts_as_history]

    def to_dict(self) -> dict:
        return {"format": EXPORT_FORMAT, "system_prompt": self.system_prompt,
                "exchanges": [e.saved() for e in self.exchanges if e.done]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data, max_message_chars: int) -> Conversation:
        """A conversation from an export or the browser's copy; raises Refused if it is malformed."""
        if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
            raise Refused("not a saved conversation of this playground")
        system = _bounded_text(data.get("system_prompt", ""), max_message_chars, "system_prompt")
        items = data.get("exchanges")
        if not isinstance(items, list):
            raise Refused("a saved conversation needs a list of exchanges")
        exchanges = [_exchange_from_dict(item, max_message_chars) for item in items[-MAX_KEPT_EXCHANGES:]]
        return cls(system_prompt=system, exchanges=exchanges)


def _bounded_text(value, limit: int, name: str) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise Refused(f"{name} must be text of at most {limit} characters")
    return value


def _number_or_none(value, name: str) -> float | int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value != value):
        raise Refused(f"figure {name} must be a number")
    return value


def _exchange_from_dict(item, max_message_chars: int) -> Exchange:
    if not isinstance(item, dict):
        raise Refused("each saved exchange must be an object")
    finish = item.get("finish_reason")
    if finish not in ("stop", "length", "cancelled", "error"):
        raise Refused(f"unknown finish_reason {finish!r:.40}")
    figures = item.get("figures") or {}
    if not isinstance(figures, dict):
        raise Refused("figures must be an object")
    # only the figures the reply had: a key added here would show a chip ("spec accept n/a") it never showed
    clean = {key: _number_or_none(figures[key], key) for key in FIGURE_KEYS if key in figures}
    visible = _number_or_none(item.get("visible_ttft_ms"), "visible_ttft_ms")
    dropped = item.get("dropped_turns", 0)
    if isinstance(dropped, bool) or not isinstance(dropped, int) or not 0 <= dropped <= 10_000:
        raise Refused("dropped_turns must be a small integer")
    error = item.get("error")
    validity = item.get("validity")
    if validity is not None and not (isinstance(validity, dict) and isinstance(validity.get("valid"), bool)
                                     and isinstance(validity.get("text"), str)):
        raise Refused("validity must be an object with a boolean valid and a text")
    return Exchange(user=_bounded_text(item.get("user"), max_message_chars, "user"),
                    reply=_bounded_text(item.get("reply", ""), MAX_REPLY_CHARS, "reply"),
                    figures=clean, finish_reason=finish,
                    error=None if error is None else _bounded_text(error, MAX_LABEL_CHARS * 4, "error"),
                    config=_bounded_text(item.get("config", ""), MAX_LABEL_CHARS, "config"),
                    dropped_turns=dropped, visible_ttft_ms=visible,
                    validity=None if validity is None else {"valid": validity["valid"],
                                                            "text": _bounded_text(validity["text"], MAX_LABEL_CHARS,
                                                                                  "validity")})


# ----- prompts ------------------------------------------------------------------------------


def messages_for(system_prompt: str, pairs: list[tuple[str, str]], user: str) -> list[dict]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for past_user, reply in pairs:
        messages += [{"role": "user", "content": past_user}, {"role": "assistant", "content": reply}]
    return messages + [{"role": "user", "content": user}]


def as_prompt(has_chat_template: bool, messages: list[dict]) -> list[dict] | str:
    """What to send the engine: the messages (rendered with the chat template by the engine), or,
    for a model without a chat template, a plain transcript ending where the assistant speaks."""
    if has_chat_template:
        return messages
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nAssistant:"


@dataclass(frozen=True)
class FittedPrompt:
    """The token ids sent to the engine and what fitting them cost."""

    token_ids: list[int]
    dropped_turns: int
    reply_room: int  # tokens left for the reply before the context is full


def _newest_within(pairs: list[tuple[str, str]], characters: int) -> int:
    """How many of the oldest turns to leave out so that the rest have at most `characters` characters."""
    first, total = len(pairs), 0
    for index in range(len(pairs) - 1, -1, -1):
        total += len(pairs[index][0]) + len(pairs[index][1])
        if total > characters:
            break
        first = index
    return first


def fit_prompt(encode: Callable[[list[dict] | str], list[int]], has_chat_template: bool, system_prompt: str,
               pairs: list[tuple[str, str]], user: str, max_model_len: int, max_tokens: int,
               max_prompt_tokens: int, max_chars: int | None = None) -> FittedPrompt:
    """Encode the newest prompt that fits, dropping the oldest turns first.

    The prompt fits when it leaves `max_tokens` for the reply inside `max_model_len` and stays within
    the server's `max_prompt_tokens`. The system prompt and the newest message are always kept; if
    they alone leave less room than `max_tokens`, the reply gets what is left (it ends at the
    context length). With `max_chars`, turns beyond that many characters of conversation are left out
    before anything is encoded (a kept history can be far longer than any prompt). Encoding is done by
    the engine (`encode`), once per candidate, O(log turns) times; the chosen ids go to the engine as
    they are.
    """
    budget = min(max_prompt_tokens, max_model_len - max_tokens)
    fewest = 0 if max_chars is None else _newest_within(pairs, max_chars - len(system_prompt) - len(user))

    def attempt(dropped: int) -> list[int] | None:
        try:
            ids = encode(as_prompt(has_chat_template, messages_for(system_prompt, pairs[dropped:], user)))
        except RequestError:
            return None
        return ids if len(ids) <= budget else None

    low, high, best = fewest, len(pairs), None
    while low <= high:  # the fewest dropped turns that fit: fitting is monotone in the number dropped
        middle = (low + high) // 2
        ids = attempt(middle)
        if ids is not None:
            best, high = (middle, ids), middle - 1
        else:
            low = middle + 1
    if best is None:
        ids = encode(as_prompt(has_chat_template, messages_for(system_prompt, [], user)))  # raises if over the context
        if len(ids) > max_prompt_tokens:
            raise PromptTooLong(f"the message is {len(ids)} tokens with the chat template; this server allows "
                                f"{max_prompt_tokens} prompt tokens (PLAYGROUND_MAX_PROMPT_TOKENS)")
        best = (len(pairs), ids)
    dropped, ids = best
    return FittedPrompt(token_ids=ids, dropped_turns=dropped, reply_room=max_model_len - len(ids))


def fit_exchange(engine, conversation: Conversation, index: int, max_tokens: int, max_prompt_tokens: int,
                 max_chars: int) -> FittedPrompt:
    """Exchange `index`'s prompt (with as much history as fits, at most `max_chars` characters of it) as token
    ids for `engine`; Refused if it cannot fit. The chat and Compare's "chat with both" fit their
    conversations this way."""
    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise Refused("this model has no tokenizer, so it cannot chat (its engine still serves token-id "
                      "prompts through the API)")
    return fit_prompt(engine.encode, bool(getattr(tokenizer, "chat_template", None)), conversation.system_prompt,
                      conversation.history_pairs(before=index), conversation.exchanges[index].user,
                      engine.info.max_model_len, max_tokens, max_prompt_tokens, max_chars)
