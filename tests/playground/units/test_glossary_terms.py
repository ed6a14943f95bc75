"""The glossary's and the GQA choice's claims about quality quote the CPU precision table, so they cannot drift from
what was measured (assets/results/cpu/precision.json, made by `python -m engine.precision_table`)."""

from __future__ import annotations

import json

from playground.engine_panel.choices import help_line
from playground.glossary.terms import tooltip
from tests.support.paths import PROJECT_ROOT

TABLE = PROJECT_ROOT / "assets" / "results" / "cpu" / "precision.json"


def perplexities() -> dict[str, int]:
    rows = json.loads(TABLE.read_text(encoding="utf-8"))["rows"]
    return {row["row"].split("=", 1)[1] if row["row"].startswith("quantization=") else row["row"]: round(
        row["perplexity"]) for row in rows}


def test_pooling_claims_quote_the_measured_perplexities():
    measured = perplexities()
    none, gqa4, gqa2 = measured["none"], measured["gqa=4"], measured["gqa=2"]
    assert gqa4 > 1.5 * none, "the table no longer shows pooling to 4 KV heads as ruinous: reword the claims"
    assert f"from {none} to {gqa4}" in tooltip("gqa") and f"2 heads to {gqa2}" in tooltip("gqa")
    assert "a little" not in tooltip("gqa") and f"doubled it (to {gqa4})" in tooltip("perplexity")
    assert f"to {measured['sparse-2:4']})" in tooltip("perplexity")
    for level in ("native-int8", "native-int4", "int8", "nf4"):
        assert abs(measured[level] - none) / none < 0.01, f"{level} moved perplexity 1% or more: reword the claim"


def test_the_gqa_choice_warns_beside_it_that_it_changes_the_answers():
    measured = perplexities()
    line = help_line("gqa", "4")
    assert "changes the answers" in line and f"from {measured['none']} to {measured['gqa=4']}" in line
    assert "changes the answers" not in help_line("gqa", "mha"), "mha keeps the outputs"
