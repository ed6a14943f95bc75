"""Which OpenAI calls may start: calls and tokens in flight (prompts x max_tokens), overall and per client."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from playground.api.admission import Admission, client_address
from playground.api.errors import APIError


def test_tokens_in_flight_are_bounded_overall_and_per_client():
    admission = Admission(max_calls=10, max_tokens=1000, max_client_tokens=400)
    held = admission.admit("a", 400)
    with pytest.raises(APIError, match="PLAYGROUND_MAX_CLIENT_TOKENS_IN_FLIGHT") as busy:
        admission.admit("a", 1)
    assert busy.value.status == 429
    others = [admission.admit(client, 300) for client in ("b", "c")]
    with pytest.raises(APIError, match="PLAYGROUND_MAX_TOKENS_IN_FLIGHT"):
        admission.admit("d", 301)
    admission.leave(held)
    assert admission.in_flight() == (2, 600)
    admission.admit("a", 400)
    for ticket in others:
        admission.leave(ticket)
    with pytest.raises(APIError, match="one client may have in flight") as never:
        admission.admit("e", 401)  # no bound could ever admit it: not worth retrying
    assert never.value.status == 400 and never.value.param == "max_tokens"


def test_calls_in_flight_are_bounded_overall_and_per_client():
    admission = Admission(max_calls=8, max_tokens=1000, max_client_tokens=1000)
    mine = [admission.admit("a", 1), admission.admit("a", 1)]
    with pytest.raises(APIError, match="the most one client may have"):
        admission.admit("a", 1)  # a quarter of the 8 calls
    others = [admission.admit(client, 1) for client in "bcdefg"]
    with pytest.raises(APIError, match="8 requests in flight"):
        admission.admit("h", 1)
    admission.leave(mine[0])
    admission.admit("a", 1)
    for ticket in others:
        admission.leave(ticket)
    assert admission.in_flight() == (2, 2)


def test_a_client_is_its_address_or_the_address_its_proxy_saw():
    request = SimpleNamespace(client=SimpleNamespace(host="10.0.0.9"),
                              headers={"x-forwarded-for": "6.6.6.6, 203.0.113.7"})
    assert client_address(request, None) == "10.0.0.9"
    assert client_address(request, "x-forwarded-for") == "203.0.113.7"  # the entry the proxy appended
    assert client_address(SimpleNamespace(client=None, headers={}), "x-forwarded-for") == "unknown"
