"""Compare's structured output: B alone or A and B (the baseline with A) get the grammar, each side's requests carry
its own, a bad spec is refused before anything runs, and a timed run refuses what its measurement cannot send."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine import GuidedDecoding, SamplingParams
from playground.compare.comparison import Comparisons
from playground.compare.request import PANEL, CompareRequest, ComparisonParser
from playground.shared.errors import Refused
from playground.shared.settings import Settings

REGEX = GuidedDecoding("regex", "(yes|no)")


@pytest.fixture
def parser():
    context = SimpleNamespace(settings=Settings(), validate=lambda fields: SimpleNamespace(**fields), presets={})
    return ComparisonParser(context, read_panel=None)


def test_the_grammar_goes_to_b_alone_or_to_a_and_b(parser):
    panel = {"model": "demo"}
    b_only = parser.sides(PANEL, "", PANEL, "", False, panel, "regex", "(yes|no)", "B")
    assert [side.guided for side in b_only] == [None, REGEX]
    assert b_only[1].sampling(SamplingParams(max_tokens=4, temperature=0.5)) == SamplingParams(
        max_tokens=4, temperature=0.5, guided=REGEX)
    assert [side.guided for side in parser.sides(PANEL, "", PANEL, "", False, panel, "regex", "(yes|no)",
                                                 "A and B")] == [REGEX, REGEX]
    assert [side.guided for side in parser.sides(PANEL, "", PANEL, "", False, panel)] == [None, None]
    with pytest.raises(Refused, match="not valid JSON"):
        parser.sides(PANEL, "", PANEL, "", False, panel, "JSON schema", "{", "B")
    with pytest.raises(Refused, match="goes to B or A and B"):
        parser.sides(PANEL, "", PANEL, "", False, panel, "regex", "x", "A")


def test_a_timed_run_refuses_structured_output_before_it_takes_the_measurement_slot(parser):
    sides = parser.sides(PANEL, "", PANEL, "", False, {"model": "demo"}, "JSON object", "", "B")
    request = CompareRequest(sides, ("hi",), SamplingParams(max_tokens=4, seed=0), 1, False)
    taken = []
    context = SimpleNamespace(measurements=SimpleNamespace(take=taken.append))
    with pytest.raises(Refused, match="Chat with both"):
        next(Comparisons(context).run(request, session=None))
    assert taken == []
