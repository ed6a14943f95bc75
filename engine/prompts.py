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


def encode_prompt(prompts: PromptEncoder | None, prompt, tools: list[dict] | None, vocab_size: int,
                  max_model_len: int) -> list[int]:
    """Token ids of a prompt (text, token ids, or chat messages rendered with the chat template, with `tools` where
    the template renders them) for a model of `vocab_size` and context `max_model_len`; `prompts` is None for a
    model without a tokenizer. RequestError for anything else, and for a prompt that leaves no room to generate.
    One rule for every engine that encodes locally (the in-process engine, a served model's client)."""
    is_messages = isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt)
    if tools is not None and not (is_messages and isinstance(tools, list)
                                  and all(isinstance(tool, dict) for tool in tools)):
        raise RequestError("tools must be a list of tool objects, and go with chat messages (not with text or "
                           "token ids)")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    elif isinstance(prompt, str) or is_messages:
        if prompts is None:
            raise RequestError("this model has no tokenizer: send token ids instead of text")
        ids = prompts.text(prompt) if isinstance(prompt, str) else prompts.messages(prompt, tools)
    else:
        raise RequestError("a prompt must be a string, a list of token ids or a list of chat messages "
                           f"(role/content dicts), got {type(prompt).__name__}")
    if not ids:
        raise RequestError("the prompt is empty")
    if any(t < 0 or t >= vocab_size for t in ids):
        raise RequestError(f"token ids must be in [0, {vocab_size})")
    if len(ids) >= max_model_len:
        raise RequestError(f"the prompt is {len(ids)} tokens but max_model_len is {max_model_len}; "
                           "shorten it (at least one token must fit after it)")
    return ids


def prompt_batch(prompts) -> list:
    """`generate()`'s argument as a list of prompts: one prompt (text, token ids or chat messages) or a list of them."""
    if prompts is None or not isinstance(prompts, str | list | tuple):
        raise RequestError("generate() takes a prompt or a list of prompts")
    single = isinstance(prompts, str) or (isinstance(prompts, list) and bool(prompts) and (
        all(isinstance(p, int) for p in prompts) or all(isinstance(p, dict) for p in prompts)))
    batch = [prompts] if single else list(prompts)
    if not batch:
        raise RequestError("generate() got no prompts")
    return batch
