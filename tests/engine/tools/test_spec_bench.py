"""`python -m engine.bench` with speculation: the acceptance figures cover the measured requests only,
under vLLM's names; the speculative presets and the repeat workload are valid."""

from __future__ import annotations

import json
import re

import pytest

from engine import EngineStats
from engine.presets import PRESETS_DIR
from engine.tools.bench import build_config, main
from engine.tools.measure import speculative_figures
from engine.tools.workloads import read_jsonl_prompts
from tests.support.spec_support import build_llama, build_truncated_draft
from tests.support.tiny_models import VOCAB


def test_cli_reports_acceptance_of_the_measured_requests(tmp_path):
    target = build_llama(tmp_path / "target", VOCAB, later_layer_scale=0.1)
    draft = build_truncated_draft(target, tmp_path / "draft")
    out = tmp_path / "spec.json"
    assert main(["--set", f"model={target}", "--set", f"draft_model={draft}", "--num-prompts", "4",
                 "--input-len", "8", "--output-len", "24", "--preset", "speculative-draft",
                 "--compare", "continuous", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["config"]["speculative"] == "draft" and report["draft_model"] == draft
    drafts, proposed, accepted = (report[f"spec_decode_{key}"] for key in ("num_drafts", "draft_tokens",
                                                                          "accepted_tokens"))
    assert 0 < accepted < proposed <= 4 * drafts
    # 4 requests x 24 tokens: each verification step yields its accepted tokens plus one
    assert drafts <= 4 * 24 - accepted
    assert report["spec_acceptance_rate"] == pytest.approx(accepted / proposed)
    assert report["spec_decode_acceptance_rate"] == pytest.approx(100 * accepted / proposed)
    assert report["spec_decode_acceptance_length"] == pytest.approx(1 + accepted / drafts)
    assert report["spec_mean_accepted_tokens"] == pytest.approx(accepted / drafts)
    rates = report["spec_decode_per_position_acceptance_rates"]
    assert len(rates) == 4 and sum(rates) * drafts == pytest.approx(accepted)
    assert "spec_decode_acceptance_length" not in report["compare"] and report["compare"]["spec_acceptance_rate"] == 0


def test_warm_up_verifications_are_not_counted():
    before = EngineStats(spec_num_drafts=3, spec_num_draft_tokens=12, spec_num_accepted_tokens=5,
                         spec_accepted_per_position=(3, 1, 1, 0))
    after = EngineStats(spec_num_drafts=13, spec_num_draft_tokens=52, spec_num_accepted_tokens=25,
                        spec_accepted_per_position=(10, 7, 5, 3))
    figures = speculative_figures(before, after, speculative=True)
    assert figures["spec_decode_num_drafts"] == 10 and figures["spec_decode_draft_tokens"] == 40
    assert figures["spec_acceptance_rate"] == 0.5 and figures["spec_decode_acceptance_length"] == 3.0
    assert figures["spec_decode_per_position_acceptance_rates"] == [0.7, 0.6, 0.4, 0.3]


COMMON_WORDS = {"what", "does", "the", "for", "you", "can", "tell", "about", "explain", "please", "describe", "is",
                "me", "briefly", "purpose", "know", "like", "to", "of", "should", "quick", "question", "give", "short",
                "explanation", "remind", "a", "an", "how", "use", "i", "do", "could", "what's"}


def test_speculative_presets_and_the_repeat_workload_are_valid():
    assert build_config("speculative-draft", {}).speculative == "draft"
    assert build_config("speculative-ngram", {}).speculative == "ngram"
    prompts = read_jsonl_prompts(PRESETS_DIR / "repeat_prompts.jsonl")
    assert len(prompts) >= 8
    for messages in prompts:
        assert [m["role"] for m in messages] == ["user", "assistant", "user"]
        first, again = ({word.strip(".") for word in re.findall(r"[\w.]+", m["content"].lower())}
                        for m in (messages[0], messages[2]))
        assert messages[1]["content"] and messages[0]["content"] != messages[2]["content"]
        assert any("." in word or word.isidentifier() and len(word) > 2 for word in first & again - COMMON_WORDS), \
            "the second question asks about the same entry as the first"
