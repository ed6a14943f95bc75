"""Each quantization level's CPU speed note (shown beside the choice) agrees with the CPU precision table: a level
slower than float32 there says so, and the factor it quotes is the table's (assets/results/cpu/precision.json)."""

from __future__ import annotations

import json
import re

import pytest

from engine import choice_note
from engine.quant.levels import LEVELS
from tests.support.paths import PROJECT_ROOT

ROWS = {row["quantization"]: row for row in json.loads(
    (PROJECT_ROOT / "assets" / "results" / "cpu" / "precision.json").read_text(encoding="utf-8"))["rows"]
    if "quantization" in row}


@pytest.mark.parametrize("level", sorted(set(ROWS) & set(LEVELS)))
def test_a_level_slower_than_float32_on_the_cpu_says_how_much_slower(level):
    slowdown = ROWS[level]["batch1_tpot_ms"] / ROWS["none"]["batch1_tpot_ms"]
    note = choice_note("quantization", level, device="cpu")
    quoted = re.search(r"about ([\d.]+)x float32's time per token", note)
    if slowdown > 1.5:
        assert "slow" in note and quoted, f"{level} is {slowdown:.1f}x float32 per token but its note does not say"
    if quoted:
        assert float(quoted.group(1)) == pytest.approx(slowdown, rel=0.2), (level, slowdown, note)
