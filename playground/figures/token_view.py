"""A reply as its tokens, each shaded by the probability the model gave it, with the top alternatives on hover.

Why: a reply's text hides how sure the model was of each piece of it; the engine reports every emitted token's
log-probability and the most likely tokens at that step (`TokenLogprob`, log-softmax of the raw logits), and this
view puts those numbers on the text. Token text is the model's output, which a prompt can steer, so every piece
is HTML-escaped; the markup is spans and classes only (the chat box sanitizes HTML) and one line (the chat box
reads a blank line inside HTML as the end of it).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine import TokenLogprob
from playground.shared.measurement import token_pieces

SHADES = 10  # probability bands, each its own class (tok-p0: under 10%, ... tok-p9: 90% and over)
LEGEND = "token probabilities: the less likely a token, the darker its shade; hover a token for its top alternatives"


@dataclass(frozen=True)
class ReplyToken:
    """One emitted token: its text in the reply, its probability, and the most likely tokens at its step."""

    text: str
    probability: float
    top: tuple[tuple[str, float], ...]  # (text, probability), most likely first
    chosen_rank: int | None  # where the token itself is among `top` (None: not among them)


def reply_tokens(tokenizer, logprobs: Sequence[TokenLogprob]) -> list[ReplyToken]:
    """The reply's tokens from the engine's log-probabilities: each chosen token's text as it reads in the reply
    (decoded in context), each alternative's text decoded alone."""
    pieces = token_pieces(tokenizer, [entry.token_id for entry in logprobs])
    alone: dict[int, str] = {}

    def text_of(token_id: int) -> str:
        if token_id not in alone:
            alone[token_id] = tokenizer.decode([token_id]) if tokenizer is not None else f"<{token_id}>"
        return alone[token_id]

    return [ReplyToken(piece, math.exp(entry.logprob), tuple((text_of(t), math.exp(lp)) for t, lp in entry.top),
                       next((rank for rank, (t, _) in enumerate(entry.top) if t == entry.token_id), None))
            for piece, entry in zip(pieces, logprobs, strict=True)]


def _shade(probability: float) -> int:
    return min(SHADES - 1, max(0, int(probability * SHADES)))


def _percent(probability: float) -> str:
    """A probability in percent, small ones with their first significant digit (not a flat 0.0%)."""
    if probability >= 0.001:
        return f"{probability:.1%}"
    return f"{probability * 100:.1g}%" if probability >= 1e-7 else "<0.00001%"


def _shown(text: str) -> str:
    """A token's text where its whitespace can be seen (in the tooltip): quoted, newlines and tabs as symbols."""
    return html.escape("“" + text.replace("\n", "↵").replace("\t", "⇥") + "”", quote=False)


def _token_html(token: ReplyToken) -> str:
    rows = [f'<span class="tip-row tip-own">{_shown(token.text)} {_percent(token.probability)}</span>']
    if token.top:
        rows.append('<span class="tip-head">top alternatives</span>')
        rows += [f'<span class="tip-row{" tip-chosen" if rank == token.chosen_rank else ""}">{_shown(text)} '
                 f'{_percent(probability)}</span>' for rank, (text, probability) in enumerate(token.top)]
    text = html.escape(token.text, quote=False).replace("\n", "<br>")
    return (f'<span class="tok tok-p{_shade(token.probability)}">{text}'
            f'<span class="tok-tip">{"".join(rows)}</span></span>')


def tokens_html(tokens: Sequence[ReplyToken]) -> str:
    """The reply as shaded tokens with their tooltips, after a one-line legend."""
    body = "".join(_token_html(token) for token in tokens)
    return (f'<div class="token-view"><div class="token-legend">{html.escape(LEGEND)}</div>'
            f'<div class="tokens">{body}</div></div>')
