"""Compare's structured output: B alone or A and B (the baseline with A) get the grammar, each side's requests carry
its own, a bad spec is refused before anything runs, and a timed run's table gives the mask's cost per token and
its share of TPOT for a side that sent a grammar ("–" for one that did not)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine import GuidedDecoding, RequestMetrics, SamplingParams
from playground.compare.comparison import FIGURE_KEYS, FIGURES, guided_figures
from playground.compare.request import PANEL, ComparisonParser
from playground.figures.run_views import compare_table_html
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
    with pytest.raises(Refused, match="baseline cannot decode under a grammar"):
        parser.sides(PANEL, "", PANEL, "", True, panel, "regex", "(yes|no)", "A and B")


def test_a_structured_run_reports_its_mask_per_token_and_share_of_tpot_and_a_side_without_a_grammar_a_dash():
    def output(finish, tokens, tpot, mask):
        return SimpleNamespace(finish_reason=finish, metrics=RequestMetrics(output_tokens=tokens, tpot=tpot,
                                                                            guided_mask_s=mask))

    outputs = [output("stop", 4, 0.1, 0.004), output("length", 6, 0.3, 0.016), output("cancelled", 9, 1.0, 9.0), None]
    figures = guided_figures(outputs)  # 20 ms over 10 tokens, mean TPOT 200 ms; the cancelled request left out
    assert figures == {"guided_mask_ms": pytest.approx(2.0), "guided_mask_share": pytest.approx(0.01)}

    def side(guided, values):
        shown = dict.fromkeys(FIGURE_KEYS) | values
        return {"figures": shown, "spread": {key: None for key in FIGURE_KEYS}, "summary": "s", "guided": guided,
                "config": {"backend": "native", "speculative": "off", "prefix_caching": True}}

    outcome = {"labels": ["A", "B"], "sides": {"A": side(None, {}), "B": side("json_schema", figures)},
               "ratios": {"B": dict.fromkeys(FIGURE_KEYS)}, "rounds": 1, "orders": [["A", "B"]], "prompts": ["p"],
               "sampling": {"max_tokens": 4, "temperature": 0.0, "seed": 0}}
    table = compare_table_html(outcome, FIGURES)
    assert 'data-side="A" data-key="guided_mask_ms"><span class="na"' in table
    assert 'data-side="B" data-key="guided_mask_ms">2.000 ms</td>' in table
    assert 'data-side="B" data-key="guided_mask_share">1.0%</td>' in table
