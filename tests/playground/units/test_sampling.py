"""The sampling controls (chat box, `/chat`, OpenAI routes) -> `SamplingParams`, checked and capped."""

from __future__ import annotations

import math

import pytest

from playground.shared.errors import Refused
from playground.shared.sampling import parse_sampling
from playground.shared.settings import Settings
from playground.shared.values import parse_int, parse_number


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


def test_integers_are_taken_exactly_and_every_refusal_names_its_field():
    """Seeds and counts never pass through a float: 2**60 and 2**60 + 1 stay two seeds, the largest seed is taken;
    integers beyond any float, NaN and lone surrogates are refused with the field named, never an exception."""
    settings = Settings(max_new_tokens=64)
    for seed in (2**53 + 1, 2**60, 2**60 + 1, 2**60 + 7, 2**63 - 1):
        assert parse_sampling(settings, 10, seed=seed).seed == seed
        assert parse_sampling(settings, 10, seed=str(seed)).seed == seed
    assert parse_int("block_size", 16.0, 1) == 16 and parse_int("block_size", " 32 ", 1) == 32
    huge = 10**400
    for kwargs, field in ((dict(max_tokens=huge), "max_tokens"), (dict(temperature=huge), "temperature"),
                          (dict(top_p=-huge), "top_p"), (dict(top_k=huge), "top_k"), (dict(seed=huge), "seed"),
                          (dict(seed="9" * 5000), "seed"), (dict(seed=1e300), "seed"), (dict(seed=2**63), "seed"),
                          (dict(top_k=1.5), "top_k"), (dict(stop="\udc00"), "stop"), (dict(stop=[None]), "stop"),
                          (dict(ignore_eos="yes"), "ignore_eos")):
        with pytest.raises(Refused) as refused:
            parse_sampling(settings, **{"max_tokens": 10, **kwargs})
        assert refused.value.field == field and field in str(refused.value)
    for value in (huge, -huge, math.inf, "1e400"):
        with pytest.raises(Refused, match="number"):
            parse_number("kv_cache_bytes (MiB)", value)
