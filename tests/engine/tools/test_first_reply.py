"""`python -m engine.first_reply`: each load's Apply time, warm-up and replies, and the first-versus-next medians."""

from __future__ import annotations

import json
import statistics

import pytest

from engine.tools.first_reply import main


def test_the_first_reply_is_compared_with_the_next_ones_of_every_load(tiny_chat_dir, tmp_path, capsys):
    out = tmp_path / "first.json"
    assert main(["--model", tiny_chat_dir, "--quantization", "none", "--applies", "2", "--replies", "3",
                 "--max-tokens", "4", "--pause", "0", "--json", str(out)]) == 0
    [result] = json.loads(out.read_text())
    assert result["quantization"] == "none" and len(result["loads"]) == 2
    for load in result["loads"]:
        assert len(load["replies"]) == 3 and 0 < load["warmup_s"] < load["apply_s"]
    ttft = result["ttft_ms"]
    assert ttft["first"] == statistics.median(load["replies"][0]["ttft_ms"] for load in result["loads"])
    assert ttft["next"] == statistics.median(r["ttft_ms"] for load in result["loads"] for r in load["replies"][1:])
    assert ttft["first_over_next"] == pytest.approx(ttft["first"] / ttft["next"])
    assert "none: Apply" in capsys.readouterr().out
