"""Chat's "measure" action: the message asked several times on the session's configuration, its median and range
shown, the conversation left alone, and the repeats capped by the server."""

from __future__ import annotations

import re

import pytest

from playground.app import create_playground
from playground.chat.measure import measure_prompt
from playground.page import PageHandlers
from playground.shared.errors import Refused
from playground.shared.sampling import parse_sampling
from playground.shared.settings import Settings


@pytest.fixture(scope="module")
def chat_app(tiny_chat_dir):
    context = create_playground(Settings(max_measure_repeats=3), default_model=tiny_chat_dir, models={})
    yield PageHandlers(context)
    context.pool.close()


def test_measure_asks_the_prompt_again_and_gives_median_and_range(chat_app):
    session = chat_app.context.new_session()
    notice = chat_app.chat.measure("What does a KV cache store?", "", 6, 0.0, 1.0, 0, "", [], "off", "", False,
                                   session)
    assert "measured 3× on" in notice, "the server's cap of 3 bounds the default 5"
    ttft = re.search(r"engine TTFT median (\d+) ms, (\d+)–(\d+) ms", notice)
    decode = re.search(r"decode median ([\d.]+) tok/s, ([\d.]+)–([\d.]+) tok/s", notice)
    assert ttft and decode, notice
    assert int(ttft[2]) <= int(ttft[1]) <= int(ttft[3]) and float(decode[2]) <= float(decode[1]) <= float(decode[3])
    assert session.conversation.exchanges == [], "measuring adds no turn"


def test_measure_refuses_more_repeats_than_the_server_allows_and_an_empty_message(chat_app):
    session = chat_app.context.new_session()
    params = parse_sampling(chat_app.context.settings, 4)
    with pytest.raises(Refused, match="2 to 3 times"):
        measure_prompt(chat_app.context, session, "hi", params, 4)
    assert "type a message" in chat_app.chat.measure("  ", "", 6, 0.0, 1.0, 0, "", [], "off", "", False, session)
    assert Settings.from_env(["demo"], env={"SPACE_ID": "me/playground"}).max_measure_repeats == 5, "public: 5"
    assert Settings.from_env(["demo"], env={}).max_measure_repeats == 20
