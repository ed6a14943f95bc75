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
from playground.benchmark.workload import parse_length, parse_workload
from playground.compare.comparison import FIGURE_KEYS, FIGURES, summarize_rounds, token_differences
from playground.compare.request import parse_changes
from playground.engine_panel.form import FORM_FIELDS
from playground.engine_panel.layout import TOOLTIPS as PANEL_TOOLTIPS
from playground.figures.run_charts import RUN_BATCH, RUN_KV, RUN_THROUGHPUT, Timeline, run_charts_html, run_series
from playground.figures.run_views import (
    benchmark_table_html,
    compare_table_html,
    history_table_html,
    noise_reason,
    progress_html,
    ratio_html,
    surge_table_html,
)
from playground.glossary.terms import ENTRIES, element_tooltips, tooltip
from playground.shared.errors import Refused
from playground.shared.settings import Settings
from playground.shared.surge import parse_surge


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
    noisy = ratio_html(1.79, "lower", "the two sides' ranges over the rounds overlap")
    assert "within noise" in noisy and "worse" not in noisy and "better" not in noisy


def test_a_timing_ratio_is_noise_unless_the_two_ranges_are_apart():
    assert noise_reason("mean_ttft_ms", [3.3, 64.6], [2.9, 9.5], rounds=3)  # the TTFT 1.79x
    assert noise_reason("mean_ttft_ms", [30.0, 40.0], [10.0, 12.0], rounds=3) is None
    assert "one round" in noise_reason("output_throughput", [100.0, 100.0], [50.0, 50.0], rounds=1)
    assert noise_reason("weights_bytes", [4.0, 4.0], [1.0, 1.0], rounds=1) is None, "bytes repeat exactly"


def comparison(rounds: int, a_ttft: list, b_ttft: list) -> dict:
    """A comparison of a plain configuration (A) with an n-gram speculating one without prefix caching (B)."""
    def side(config, ttft, acceptance, hits):
        figures = dict.fromkeys(FIGURE_KEYS, 1.0) | {"mean_ttft_ms": sum(ttft) / 2, "spec_acceptance_rate": acceptance,
                                                     "prefix_cache_hit_rate": hits}
        spread = {key: [value, value] for key, value in figures.items()} | {"mean_ttft_ms": ttft}
        return {"figures": figures, "spread": spread, "config": config, "summary": "s"}
    a = side({"backend": "native", "speculative": "off", "prefix_caching": True}, a_ttft, 0.0, 0.5)
    b = side({"backend": "native", "speculative": "ngram", "prefix_caching": False}, b_ttft, 0.6, 0.0)
    ratios = {"B": {key: b["figures"][key] / a["figures"][key] if a["figures"][key] else None for key in FIGURE_KEYS}}
    return {"labels": ["A", "B"], "sides": {"A": a, "B": b}, "ratios": ratios, "rounds": rounds,
            "orders": [["A", "B"]] * rounds, "prompts": ["p"], "sampling": {"max_tokens": 4, "temperature": 0.0,
                                                                          "seed": 0}}


def cell(table: str, side: str, key: str) -> str:
    return table.split(f'data-side="{side}" data-key="{key}">')[1].split("</td>")[0]


def ratio_cell(table: str, key: str) -> str:
    return table.split(f'data-side="B" data-key="{key}">')[1].split('<td class="ratio-cell">')[1].split("</td>")[0]


def test_compare_shows_a_dash_for_figures_a_side_does_not_have_and_colours_only_ratios_beyond_noise():
    overlapping = compare_table_html(comparison(3, [3.3, 64.6], [2.9, 9.5]), FIGURES)
    assert "within noise" in ratio_cell(overlapping, "mean_ttft_ms")
    apart = compare_table_html(comparison(3, [30.0, 40.0], [10.0, 12.0]), FIGURES)
    assert "better" in ratio_cell(apart, "mean_ttft_ms") and "noise" not in ratio_cell(apart, "mean_ttft_ms")
    assert cell(apart, "A", "spec_acceptance_rate").endswith("–</span>") and "%" in cell(apart, "B",
                                                                                         "spec_acceptance_rate")
    assert "50.0%" in cell(apart, "A", "prefix_cache_hit_rate") and "–" in cell(apart, "B", "prefix_cache_hit_rate")
    for key in ("spec_acceptance_rate", "prefix_cache_hit_rate"):
        assert ratio_cell(apart, key) == '<span class="ratio">–</span>', key


def test_benchmark_tables_show_a_dash_where_a_figure_does_not_apply():
    config = {"backend": "native", "speculative": "off", "prefix_caching": False}
    report = {key: 0.0 for key in ("completed", "cancelled_requests", "duration", "request_throughput",
                                   "output_throughput", "total_token_throughput", "prefix_cache_hit_rate",
                                   "spec_acceptance_rate", "peak_running")}
    report |= {f"{stat}_{name}_ms": 1.0 for stat in ("mean", "median", "p90", "p99")
               for name in ("ttft", "tpot", "itl", "e2el")}
    report |= {"request_goodput": None, "workload": {"goodput_slos": {}}, "config": config}
    table = benchmark_table_html(report)
    for key in ("prefix_cache_hit_rate", "spec_acceptance_rate"):
        assert f'<td data-key="{key}"><span class="na"' in table, key
    assert "0.0%" not in table
    cached = {**report, "prefix_cache_hit_rate": 0.5, "config": {**config, "prefix_caching": True}}
    runs = [SimpleNamespace(number=1, label="a", report=report), SimpleNamespace(number=2, label="b", report=cached)]
    history = history_table_html(runs).split("prefix-cache hit rate")[1].split("</tr>")[0]
    assert 'class="na"' in history and "50.0%" in history and "×" not in history
    faster = {**report, "mean_ttft_ms": 0.5}
    runs[1].report = faster
    ttft = history_table_html(runs).split("TTFT, mean")[1].split("</tr>")[0]
    assert "within noise" in ttft and "better" not in ttft  # one run each: a timing ratio is never coloured


def test_a_surge_run_shows_the_chat_users_gaps_during_and_outside_it():
    report = {"chat_itl_during_surge_count": 40, "chat_p99_itl_outside_surge_ms": 10.0,
              "chat_p99_itl_during_surge_ms": 80.0, "chat_median_itl_during_surge_ms": 30.0, "chat_p99_ttft_ms": 5.0,
              "surge_median_ttft_ms": 900.0, "surge_p99_ttft_ms": 1500.0, "surge_completed": 4}
    table = surge_table_html(report)
    assert '<td data-key="chat_p99_itl_surge_over_outside">8.00x</td>' in table
    assert '<td data-key="surge_p99_ttft_ms">1,500.0 ms</td>' in table
    assert surge_table_html({"chat_itl_during_surge_count": None}) == "" and surge_table_html({}) == ""


def test_a_surge_parses_as_count_input_output_within_the_caps():
    settings = Settings(max_bench_requests=20, max_prompt_tokens=100, max_new_tokens=50, max_bench_tokens=10_000)
    surge = parse_surge(settings, "4:64:8", chat_output_len=32)
    assert (surge.count, surge.input_len, surge.output_len, surge.after_tokens) == (4, 64, 8, 16)
    assert parse_surge(settings, " ", 32) is None
    for bad in ("4:64", "4:200:8", "0:64:8", "4:64:99", "a:b:c", None):
        with pytest.raises(Refused):
            parse_surge(settings, bad, 32)
    request = parse_workload(settings, "random", None, 6, 0, 0, "16", "8", 0, True, 0, 0, 0, "4:64:8")
    assert request.spec.surge.count == 4 and request.concurrency == 10
    with pytest.raises(Refused, match="requests \\+ surge count = 24"):
        parse_workload(settings, "random", None, 20, 0, 0, "16", "8", 0, True, 0, 0, 0, "4:64:8")


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
