"""The token-probability view of a reply: each token shaded by its probability, the top alternatives in its
tooltip, and every piece of token text HTML-escaped (a prompt can make the model write markup)."""

from __future__ import annotations

import math

from engine import TokenLogprob
from playground.figures.token_view import ReplyToken, reply_tokens, tokens_html


class Letters:
    """A tokenizer whose token i is one piece of text (enough for decoding)."""

    PIECES = ["<b>", "hi", " there", "\n", '"&\'']

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.PIECES[i] for i in ids)


def test_tokens_carry_their_text_probability_and_alternatives():
    logprobs = [TokenLogprob(1, math.log(0.5), ((0, math.log(0.3)), (1, math.log(0.5)))),
                TokenLogprob(2, math.log(0.25), ())]
    tokens = reply_tokens(Letters(), logprobs)
    assert [t.text for t in tokens] == ["hi", " there"]
    assert tokens[0].probability == 0.5 and tokens[0].top == (("<b>", 0.3), ("hi", 0.5))
    assert tokens[0].chosen_rank == 1 and tokens[1].chosen_rank is None


def test_token_text_is_escaped_everywhere_and_shaded_by_probability():
    tokens = [ReplyToken("<script>alert(1)</script>", 0.95, (("<img src=x onerror=alert(1)>", 0.03),), None),
              ReplyToken("\n", 0.05, (('"&\'', 0.9), ("\n", 0.05), ("x", 0.00003)), 1)]
    view = tokens_html(tokens)
    assert "<script>" not in view and "<img" not in view
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in view and "“&lt;img src=x onerror=alert(1)&gt;” 3.0%" in view
    assert view.count('class="tok tok-p9"') == 1 and view.count('class="tok tok-p0"') == 1
    assert '<span class="tip-row tip-own">“↵” 5.0%</span>' in view, "a newline token is shown as ↵ in its tooltip"
    assert '<span class="tip-row tip-chosen">“↵” 5.0%</span>' in view and "“\"&amp;'” 90.0%" in view
    assert "“x” 0.003%" in view, "an unlikely alternative keeps its first significant digit"
    assert "\n" not in view, "one line: the chat box ends inline HTML at a blank line"
    assert '<span class="tok tok-p0"><br><span class="tok-tip">' in view
