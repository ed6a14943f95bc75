"""The Compare and Benchmark tabs' pure parts, without an engine: ratios and spreads over rounds, token
differences, the binning of a run's steps for the charts, length and change parsing, the CSV export, the glossary.
"""

from __future__ import annotations

import csv
import io
from types import SimpleNamespace

import pytest

from engine import StepRecord
from playground.benchmark.exports import runs_csv
from playground.benchmark.workload import parse_length
from playground.compare.comparison import FIGURE_KEYS, summarize_rounds, token_differences
from playground.compare.request import parse_changes
from playground.engine_panel.form import FORM_FIELDS
from playground.engine_panel.layout import TOOLTIPS as PANEL_TOOLTIPS
from playground.figures.run_charts import RUN_BATCH, RUN_KV, RUN_THROUGHPUT, Timeline, run_charts_html, run_series
from playground.figures.run_views import progress_html, ratio_html
from playground.glossary.terms import ENTRIES, element_tooltips, tooltip
from playground.shared.errors import Refused


def run(**figures):
    return SimpleNamespace(result=figures)


def test_rounds_give_medians_spreads_and_ratios_of_the_medians():
    rounds = [{"A": run(mean_ttft_ms=10.0, output_throughput=100.0), "B": run(mean_ttft_ms=5, output_throughput=300)},
              {"B": run(mean_ttft_ms=7.0, output_throughput=200.0), "A": run(mean_ttft_ms=14, output_throughput=50)},
              {"A": run(mean_ttft_ms=12.0, output_throughput=80.0), "B": run(mean_ttft_ms=6, output_throughput=250)}]
    summary = summarize_rounds(rounds, ["A", "B"])
    a, b = summary["sides"]["A"], summary["sides"]["B"]
    assert a["figures"]["mean_ttft_ms"] == 12.0 and b["figures"]["mean_ttft_ms"] == 6.0
    assert a["spread"]["mean_ttft_ms"] == [10.0, 14.0] and b["spread"]["output_throughput"] == [200.0, 300.0]
    assert summary["ratios"]["B"]["mean_ttft_ms"] == 0.5 and summary["ratios"]["B"]["output_throughput"] == 250 / 80
    assert summary["round_ratios"]["B"]["mean_ttft_ms"] == [0.5, 0.5, 0.5]
    assert summary["ratios"]["B"]["perplexity"] is None and set(a["figures"]) == set(FIGURE_KEYS)


def test_token_differences_name_the_first_differing_token():
    assert token_differences(["a", "b"], ["a", "b"]) == {"identical": True, "first_difference": None}
    assert token_differences(["a", "b", "c"], ["a", "x", "c"]) == {"identical": False, "first_difference": 1}
    assert token_differences(["a", "b"], ["a", "b", "c"]) == {"identical": False, "first_difference": 2}


def test_a_queued_measurement_shows_its_place():
    job = SimpleNamespace(phase="queued", ahead=2, requests_total=0, label="", started=0.0,
                          cancel=SimpleNamespace(is_set=lambda: False))
    line = progress_html(job, "benchmark")
    assert "benchmark queued" in line and "2 measurement(s) ahead of it" in line
    assert "ahead" not in progress_html(SimpleNamespace(**{**vars(job), "ahead": 0}), "benchmark")


def test_a_ratio_is_coloured_by_which_way_is_better():
    assert "better" in ratio_html(0.5, "lower") and "worse" in ratio_html(2.0, "lower")
    assert "better" in ratio_html(2.0, "higher") and "better" not in ratio_html(1.01, "higher")
    assert "worse" not in ratio_html(3.0, None) and "–" in ratio_html(None, "lower")


def step(time, duration=0.01, batch=1, blocks=1, tokens=1):
    return StepRecord(time=time, duration=duration, batch_size=batch, num_tokens=tokens, num_decode_tokens=tokens,
                      num_running=batch, kv_blocks_used=blocks, num_output_tokens=tokens)


def test_run_series_bin_each_run_from_its_own_start_and_keep_long_steps_in_every_bin_they_cover():
    first = Timeline("A", 100.0, [step(100.04, tokens=2), step(100.30, duration=0.24, batch=4, blocks=9, tokens=4)])
    second = Timeline("B", 500.0, [step(500.04, tokens=3)])
    series = run_series([first, second])
    tokens, batch, blocks = (series[chart.name] for chart in (RUN_THROUGHPUT, RUN_BATCH, RUN_KV))
    assert [t for t, _ in batch["A"]] == pytest.approx([0.05 * i for i in range(1, 7)])
    assert [v for _, v in batch["A"]] == [1, 4, 4, 4, 4, 4], "the 0.24 s step ran in every bin from 0.06 s on"
    assert [v for _, v in blocks["A"]] == [1, 9, 9, 9, 9, 9]
    assert tokens["A"][0][1] == pytest.approx(2 / 0.05) and tokens["A"][5][1] == pytest.approx(4 / 0.05)
    assert sum(v for _, v in tokens["A"]) * 0.05 == pytest.approx(6), "every token counted once"
    assert tokens["B"] == [(0.05, pytest.approx(3 / 0.05))]
    html = run_charts_html([first, second])
    assert len(html) == 3 and all(h.count("<polyline") == 2 for h in html)
    assert all("no run yet" in h for h in run_charts_html([]))


def test_lengths_and_changes_parse_as_the_bench_takes_them():
    assert parse_length("input", "64", 100) == (64, None) and parse_length("input", "8:32", 100) == (32, (8, 32))
    for bad in ("32:8", "0", "x", "1:500"):
        with pytest.raises(Refused):
            parse_length("input", bad, 100)
    assert parse_changes("quantization=int8, kv_cache_bytes=64MiB\nprefix_caching=false") == {
        "quantization": "int8", "kv_cache_bytes": 64 * 2**20, "prefix_caching": False}
    assert parse_changes("") == {} and parse_changes(None) == {}
    with pytest.raises(Refused, match="key=value"):
        parse_changes("quantization")


def test_csv_has_one_row_per_run_and_dotted_columns_for_nested_figures():
    text = runs_csv([{"completed": 3, "config": {"model": "demo"}, "itl": [1, 2]},
                     {"completed": 5, "workload": {"seed": 1}}])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [row["completed"] for row in rows] == ["3", "5"] and rows[0]["config.model"] == "demo"
    assert rows[1]["workload.seed"] == "1" and "itl" not in rows[0]


def test_every_engine_panel_field_and_figure_has_a_plain_words_entry():
    tips = element_tooltips(PANEL_TOOLTIPS)
    assert all(tips.get(f"ctl-{name}") for name in FORM_FIELDS if name != "custom_model")
    for figure in ("ttft", "tpot", "itl", "e2el", "request_goodput", "prefix_cache_hit_rate", "spec_acceptance_rate",
                   "peak_memory_bytes", "perplexity", "weights_bytes", "kv_cache_bytes"):
        assert tooltip(figure), figure
    assert "(E2EL - TTFT) / (output tokens - 1)" in tooltip("tpot") and all(e.what for e in ENTRIES.values())
