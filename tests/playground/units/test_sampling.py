"""The sampling controls (chat box, `/chat`, OpenAI routes) -> `SamplingParams`, checked and capped."""

from __future__ import annotations

import math

import pytest

from playground.shared.errors import Refused
from playground.shared.sampling import parse_sampling
from playground.shared.settings import Settings


def test_sampling_values_are_checked_and_capped():
    settings = Settings(max_new_tokens=64)
    params = parse_sampling(settings, 10, 0.7, 0.9, 40, "123", ["\n\n", "User:"])
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.seed, params.stop) == (
        10, 0.7, 0.9, 40, 123, ("\n\n", "User:"))
    assert parse_sampling(settings, 10, 1e-40).temperature == 0.0  # a tiny temperature is greedy, not an overflow
    assert parse_sampling(settings, 10, seed="").seed is None
    for kwargs, message in ((dict(max_tokens=65), "PLAYGROUND_MAX_NEW_TOKENS"),
                            (dict(temperature=math.nan), "temperature"), (dict(temperature=2.5), "temperature"),
                            (dict(top_p=0), "top_p"), (dict(top_k=-1), "top_k"), (dict(seed=2**64), "seed"),
                            (dict(seed="abc"), "seed"), (dict(stop=["a"] * 5), "at most 4"),
                            (dict(stop=["x" * 65]), "64 characters"), (dict(stop=[3]), "strings")):
        with pytest.raises(Refused, match=message):
            parse_sampling(settings, **{"max_tokens": 10, **kwargs})
