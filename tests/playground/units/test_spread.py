"""A reply's TTFT and decode speed beside its configuration's running median and range in this conversation."""

from __future__ import annotations

from playground.figures.conversation_views import render_chat
from playground.figures.spread import running_spreads
from playground.shared.conversation import Conversation, Exchange


def reply(config: str, ttft: float, decode: float) -> Exchange:
    return Exchange("same question", "answer", {"engine_ttft_ms": ttft, "decode_tokens_per_s": decode}, "stop",
                    config=config)


def test_each_reply_shows_the_running_spread_of_its_own_configuration():
    base, int8 = "demo · defaults", "demo · int8"
    exchanges = [reply(base, 8, 219.0), reply(int8, 66, 16.0), reply(base, 188, 62.0), reply(base, 40, 100.0),
                 reply(int8, 86, 12.0)]
    spreads = running_spreads(exchanges)
    assert spreads[0] == {} and spreads[1] == {}, "one reply has no spread yet"
    ttft = spreads[3]["engine_ttft_ms"]
    assert (ttft.median, ttft.low, ttft.high, ttft.count) == (40, 8, 188, 3), "keyed by the configuration's label"
    assert spreads[4]["decode_tokens_per_s"].count == 2 and spreads[4]["decode_tokens_per_s"].high == 16.0
    assert spreads[2]["engine_ttft_ms"].count == 2, "a reply's spread covers the replies up to it"
    chat = render_chat(Conversation("", exchanges))
    assert "40 ms (median 40 ms, 8–188 ms over 3 replies)" in chat[7]["content"]
    assert "12.0 tok/s (median 14.0 tok/s, 12.0–16.0 tok/s over 2 replies)" in chat[9]["content"]
    assert "median" not in chat[1]["content"]


def test_a_reply_still_streaming_is_not_counted():
    streaming = Exchange("q", "partial", {"engine_ttft_ms": 500.0}, None, config="demo · defaults")
    assert running_spreads([reply("demo · defaults", 10, 1.0), streaming])[1] == {}
