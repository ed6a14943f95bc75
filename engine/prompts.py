"""Prompts as token ids: plain text, or chat messages rendered with the model's chat template, where text that a
user wrote never becomes a control token.

Why: a chat template joins a conversation with control tokens (`<|im_start|>`, `<|eot_id|>`, ...). Rendering it to
text and tokenising that text turns a `<|im_end|>` typed inside a message into the control token too, so a user
could close their own turn and write a system or assistant turn of their choosing. Here only the template's own
control tokens are tokens; the same strings inside messages, and anywhere in a plain-text prompt, are encoded as the
characters they are (transformers' `sanitize_control_tokens`). Token ids stay the way to send control tokens on
purpose. Text is also checked to be encodable (no lone surrogates), which the tokenizer would fail on unclearly.
"""

from __future__ import annotations

import re

from transformers.utils.chat_template_utils import encode_marked_chat, mark_control_tokens

from engine.errors import RequestError


def check_text(text: str, what: str) -> None:
    """Text must be encodable (no lone surrogates), or the tokenizer fails in unclear ways."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise RequestError(f"{what} is not valid Unicode text (it contains a lone surrogate at position "
                           f"{error.start})") from None


def check_messages(messages: list[dict]) -> None:
    for index, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise RequestError(f"chat message {index} needs a 'role' string")
        if not isinstance(content, str):
            raise RequestError(f"chat message {index} needs a 'content' string, got {type(content).__name__}")
        check_text(content, f"chat message {index}")


class PromptEncoder:
    """Encodes text and chat messages for one tokenizer; safe to call from many threads at once."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        # Every added token counts as a control token in plain text (whitespace ones, such as a "\n" token, are text).
        added = sorted((token for token in tokenizer.added_tokens_encoder if token and not token.isspace()),
                       key=len, reverse=True)
        self._control_tokens = re.compile("|".join(map(re.escape, added)) or "(?!)")
        # What the tokenizer adds around one sequence (a BOS, for many), found on a one-character probe.
        framed = tokenizer.encode("x", add_special_tokens=True)
        bare = tokenizer.encode("x", add_special_tokens=False)
        start = next((i for i in range(len(framed) - len(bare) + 1) if framed[i:i + len(bare)] == bare), 0)
        self._before, self._after = framed[:start], framed[start + len(bare):]

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template shows the model a tool list (it reads the `tools` variable), in the form the
        model was trained on."""
        template = getattr(self.tokenizer, "chat_template", None)
        templates = template.values() if isinstance(template, dict) else [template or ""]
        return any(re.search(r"\btools\b", text) for text in templates)

    def text(self, text: str) -> list[int]:
        """A plain-text prompt, framed as the tokenizer frames one sequence (e.g. after its BOS)."""
        check_text(text, "the prompt")
        if not self._control_tokens.search(text):
            return self.tokenizer.encode(text)
        marked = mark_control_tokens(text, self._control_tokens)
        ids = _encoded("the prompt cannot be encoded", lambda: encode_marked_chat(self.tokenizer, marked))
        return self._before + ids + self._after

    def messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Chat messages rendered with the chat template and a generation prompt, the template's control tokens as
        tokens and the messages' text (and the tools' names, descriptions and schemas) as text. `tools`, in
        OpenAI's form ({"type": "function", "function": {...}}), is given to a template that renders tools."""
        check_messages(messages)
        if not self.has_chat_template:
            raise RequestError("this model has no chat template: send plain text instead of messages")
        if tools is not None and not self.renders_tools:
            raise RequestError("this model's chat template does not render tools")
        return _encoded("the model's chat template cannot render these messages", lambda: (
            self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True,
                                               sanitize_control_tokens=True, return_dict=False)))


def _encoded(failure: str, encode) -> list[int]:
    try:
        return list(encode())
    except Exception as error:  # the template refuses these messages (e.g. roles out of order), or a control
        # token's text cannot be encoded apart from the token itself in this vocabulary
        raise RequestError(f"{failure}: {error}") from None
