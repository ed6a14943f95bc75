"""A conversation as people see it: the chat box's messages, each reply with its figure chips, and the
Markdown export, each reply followed by its figures in one line.

Why apart from the conversation: the record (`playground/shared/conversation.py`) is data the model,
the browser's copy and the JSON export share; these are views of it, and the chat and Compare's
"chat with both" draw their chat boxes the same way.
"""

from __future__ import annotations

import html

from playground.figures.replies import figures_html, guided_mask_text, spec_acceptance_text
from playground.figures.spread import running_spreads
from playground.figures.token_view import tokens_html
from playground.figures.validity import Validity, validity_html
from playground.shared.conversation import Conversation, Exchange

THINKING = '<span class="thinking">waiting for the engine…</span>'


def render_chat(conversation: Conversation) -> list[dict]:
    """The chat box's messages: two per exchange (user, assistant), so message 2i is exchange i's question; each
    reply's TTFT and decode speed beside its configuration's running median and range in this conversation; a
    finished reply sent with token probabilities shows as its tokens, one sent with structured output with its
    validity."""
    messages = []
    for exchange, spreads in zip(conversation.exchanges, running_spreads(conversation.exchanges), strict=True):
        if exchange.done and exchange.tokens:
            body = tokens_html(exchange.tokens)
        else:
            body = html.escape(exchange.reply, quote=False) if exchange.reply else ("" if exchange.done else THINKING)
        if exchange.validity is not None:
            body += validity_html(Validity(**exchange.validity))
        if exchange.error:
            body += f'\n\n<div class="reply-error">✕ {html.escape(exchange.error, quote=False)}</div>'
        if exchange.figures or exchange.done:
            body += figures_html(exchange.shown_figures, exchange.finish_reason, exchange.dropped_turns,
                                 live=not exchange.done, spreads=spreads)
        messages += [{"role": "user", "content": html.escape(exchange.user, quote=False)},
                     {"role": "assistant", "content": body}]
    return messages


def conversation_markdown(conversation: Conversation) -> str:
    """The conversation for people: each finished turn, then its figures as a quoted line."""
    lines = ["# Conversation (Inference Playground)", ""]
    if conversation.system_prompt:
        lines += [f"**System prompt:** {conversation.system_prompt}", ""]
    for number, exchange in enumerate((e for e in conversation.exchanges if e.done), start=1):
        lines += [f"## Turn {number}", "", f"**User:** {exchange.user}", "", f"**Assistant:** {exchange.reply}", ""]
        if exchange.error:
            lines += [f"**Error:** {exchange.error}", ""]
        if exchange.validity is not None:
            lines += [f"**Structured output:** {exchange.validity['text']}", ""]
        lines += [f"> {figures_line(exchange)}", ""]
    return "\n".join(lines)


def figures_line(exchange: Exchange) -> str:
    """One line of a reply's figures, each named the way the chat chips name it."""
    f = exchange.shown_figures
    parts = []
    for label, key, unit in (("engine TTFT", "engine_ttft_ms", "ms"), ("Enter → first text", "visible_ttft_ms", "ms"),
                             ("decode", "decode_tokens_per_s", "tok/s")):
        if f.get(key) is not None:
            parts.append(f"{label} {f[key]:.0f} {unit}" if unit == "ms" else f"{label} {f[key]:.1f} {unit}")
    parts.append(f"prompt {f.get('prompt_tokens') or 0} tok ({f.get('cached_tokens') or 0} cached)")
    parts.append(f"output {f.get('output_tokens') or 0} tok")
    if f.get("spec_acceptance") is not None:
        parts.append(f"spec acceptance {spec_acceptance_text(f)}")
    if "guided_mask_ms" in f:
        parts.append(f"guided mask {guided_mask_text(f)}")
    parts.append(f"finish {exchange.finish_reason}")
    if exchange.dropped_turns:
        parts.append(f"{exchange.dropped_turns} older turn(s) left out to fit the context")
    if exchange.config:
        parts.append(f"config {exchange.config}")
    return " · ".join(parts)
