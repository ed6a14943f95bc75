"""The Compare and Benchmark tabs through the running app's API (gradio_client): figures, ratios, knobs, exports,
Cancel. The app runs in-process with the real engine pool on the demo model (see tests/support/ui_helpers.py);
workloads are tiny.
"""

from __future__ import annotations

import csv
import json
import math
import time

import pytest

from engine import WorkloadSpec, build_workload
from engine.tools.bench import main as bench_main
from playground.compare.comparison import FIGURE_KEYS
from playground.compare.handlers import CompareHandlers
from playground.engine_panel.form import read_form
from playground.figures.configuration import config_tag
from playground.shared.settings import Settings
from tests.support.engine_waits import wait_until_idle
from tests.support.llama_cpp_marks import needs_llama_cpp
from tests.support.ui_helpers import api_client, serving

pytestmark = pytest.mark.slow
PROMPTS = "What does the json module do?\nHow do I read a file line by line?"


@pytest.fixture(scope="module")
def running_app(tmp_path_factory):
    with serving(tmp_path_factory, Settings(max_new_tokens=256, max_prompt_tokens=400, max_queue=8,
                                            max_message_chars=2000)) as running:
        yield running


def client(running_app):
    return api_client(running_app.url)


def compare(api, a_source="engine panel", a_changes="", b_source="engine panel", b_changes="", prompts=PROMPTS,
            max_tokens=8, temperature=0.0, top_p=1.0, top_k=0, seed=0, repeats=1, baseline=False, perplexity=False,
            surge=""):
    return api.predict(a_source, a_changes, b_source, b_changes, prompts, max_tokens, temperature, top_p, top_k, seed,
                       repeats, baseline, perplexity, "off", "", "B", surge, api_name="/compare")


def benchmark(api, dataset="random", upload=None, requests=6, concurrency=0, request_rate=0, input_tokens="16",
              output_tokens="4", prefix_tokens=0, ignore_eos=True, slo_ttft_ms=0, slo_tpot_ms=0, seed=0, surge=""):
    return api.predict(dataset, upload, requests, concurrency, request_rate, input_tokens, output_tokens,
                       prefix_tokens, ignore_eos, slo_ttft_ms, slo_tpot_ms, seed, surge, api_name="/benchmark")


def outputs(outcome, label):
    return outcome["sides"][label]["outputs"]


def engines_idle(app) -> bool:
    """Every pooled engine's requests have ended (waiting the moment the loop takes to release them), and every
    native engine has all its KV blocks back."""
    return all(wait_until_idle(entry.engine, timeout=3.0, kv_free=entry.engine.info.backend == "native")
               for entry in app.pool.entries())


# ----- Compare -------------------------------------------------------------------------------


def test_compare_times_each_side_alone_alternates_the_order_and_gives_consistent_ratios(running_app):
    """A (the panel) against B (the speculative-draft preset) and the transformers baseline, twice."""
    outcome = compare(client(running_app), b_source="speculative-draft", repeats=2, baseline=True, perplexity=True)
    assert outcome["labels"] == ["A", "B", "baseline"] and outcome["rounds"] == 2 and not outcome["cancelled"]
    assert outcome["orders"] == [["A", "B", "baseline"], ["baseline", "B", "A"]]
    windows = sorted(window for round_ in outcome["windows"] for window in round_.values())
    assert all(earlier[1] <= later[0] for earlier, later in zip(windows, windows[1:], strict=False)), "runs overlapped"
    sides = outcome["sides"]
    for label in outcome["labels"]:
        figures = sides[label]["figures"]
        assert set(FIGURE_KEYS) <= set(figures)
        assert figures["mean_ttft_ms"] > 0 and figures["output_throughput"] > 0 and figures["weights_bytes"] > 0
        assert figures["perplexity"] is not None and 1 < figures["perplexity"] < 1e4
        assert sides[label]["perplexity_reference"] == running_app.app.references.cached(running_app.model).perplexity
        assert all(len(series) == 2 for key, series in sides[label]["per_round"].items() if key != "perplexity")
        spread = sides[label]["spread"]["mean_tpot_ms"]
        assert spread[0] <= figures["mean_tpot_ms"] <= spread[1]
    for label in ("B", "baseline"):
        for key in FIGURE_KEYS:
            a, other, ratio = sides["A"]["figures"][key], sides[label]["figures"][key], outcome["ratios"][label][key]
            if a:
                assert ratio == pytest.approx(other / a), (label, key)
            else:
                assert ratio is None, (label, key)
    assert sides["B"]["config"]["speculative"] == "draft" and sides["baseline"]["config"]["backend"] == "hf"
    assert sides["B"]["figures"]["spec_acceptance_rate"] > 0 and sides["A"]["figures"]["spec_acceptance_rate"] == 0
    assert outcome["ratios"]["B"]["weights_bytes"] > 1, "the draft model's weights count on B's side"
    # greedy speculative decoding and the transformers baseline are exact: the same tokens as A
    assert outputs(outcome, "B") == outputs(outcome, "A") == outputs(outcome, "baseline")
    assert all(d["B"]["identical"] and d["baseline"]["identical"] for d in outcome["differences"])


@needs_llama_cpp
def test_native_float32_against_llama_cpp_f32_and_q8_0_is_one_run(running_app):
    """B the llama-cpp-q8_0 preset, the llama.cpp f32 baseline: three engines on the same prompts in one comparison;
    llama.cpp's float32 GGUF gives the native float32 engine's greedy tokens, its q8_0 file is a fraction of the
    bytes."""
    outcome = compare(client(running_app), b_source="llama-cpp-q8_0", baseline="llama.cpp f32")
    sides = outcome["sides"]
    assert outcome["labels"] == ["A", "B", "baseline"] and not outcome["cancelled"]
    assert sides["A"]["config"]["backend"] == "native"
    assert (sides["B"]["config"]["backend"], sides["B"]["config"]["gguf_type"]) == ("llama.cpp", "q8_0")
    assert (sides["baseline"]["config"]["backend"], sides["baseline"]["config"]["gguf_type"]) == ("llama.cpp", "f32")
    assert outputs(outcome, "baseline") == outputs(outcome, "A")
    assert 0 < outcome["ratios"]["B"]["weights_bytes"] < 0.5 < outcome["ratios"]["baseline"]["weights_bytes"]
    assert all(sides[label]["figures"]["mean_tpot_ms"] > 0 for label in outcome["labels"])


def test_compare_changes_reach_each_side(running_app):
    """Fails if a side's KEY=VALUE changes were ignored: only the side with prefix caching finds cached prompts."""
    outcome = compare(client(running_app), a_changes="prefix_caching=false, max_num_seqs=4", repeats=2)
    sides = outcome["sides"]
    assert (sides["A"]["config"]["prefix_caching"], sides["A"]["config"]["max_num_seqs"]) == (False, 4)
    assert sides["B"]["config"]["prefix_caching"] is True
    assert sides["A"]["spread"]["prefix_cache_hit_rate"] == [0.0, 0.0]
    assert sides["B"]["spread"]["prefix_cache_hit_rate"][1] > 0, "the second round finds the prompts cached"
    assert outputs(outcome, "A") == outputs(outcome, "B")


def test_compare_sampling_knobs_apply_to_both_sides(running_app):
    api = client(running_app)
    greedy = compare(api, max_tokens=12)
    sampled = compare(api, max_tokens=12, temperature=1.5, seed=3)
    again = compare(api, max_tokens=12, temperature=1.5, seed=3)
    reseeded = compare(api, max_tokens=12, temperature=1.5, seed=4)
    top_k_one = compare(api, max_tokens=12, temperature=1.5, top_k=1, seed=3)
    short = compare(api, max_tokens=3)
    assert outputs(sampled, "A") == outputs(sampled, "B") == outputs(again, "A"), "same seed, same sampled text"
    assert outputs(sampled, "A") != outputs(greedy, "A"), "temperature had no effect"
    assert outputs(reseeded, "A") != outputs(sampled, "A"), "the seed had no effect"
    assert outputs(top_k_one, "A") == outputs(greedy, "A"), "top_k=1 must be greedy"
    nucleus = compare(api, max_tokens=12, temperature=1.5, top_p=0.05, seed=3)
    assert outputs(nucleus, "A") != outputs(sampled, "A"), "top_p had no effect"
    assert nucleus["sampling"]["top_p"] == 0.05
    assert max(short["sides"]["A"]["output_tokens"]) <= 3 < max(greedy["sides"]["A"]["output_tokens"])
    assert greedy["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "ignore_eos": False,
                                  "max_tokens": 12}


def test_stop_ends_a_comparison_cleanly_with_the_runs_that_finished(running_app):
    """Stop (the tab's button) cancels the side in flight, runs no further side, and leaves no request running."""
    app = running_app.app
    compare = CompareHandlers(app, read_panel=read_form)
    session = app.new_session()
    prompts = "\n".join(f"Tell me about module number {n}." for n in range(8))
    request = compare.parser.parse("engine panel", "", "static", "", prompts, 256, 0.0, 1.0, 0, 0, 3, True, False,
                                   "off", "", "B", "", session.config.to_dict())
    jobs = compare.comparisons.run(request, session)
    job = next(jobs)
    while job.phase != "running" or job.requests_done < 1:
        job = next(jobs)
    compare.stop(session)
    job = list(jobs)[-1]
    outcome = compare.comparisons.outcome(request, job)
    assert outcome["cancelled"] and job.runs_done < 9
    assert engines_idle(app), "a stopped comparison left requests in the engine"


def test_compare_refuses_bad_input_with_one_clear_message(running_app):
    from gradio_client.exceptions import AppError

    api = client(running_app)
    with pytest.raises(AppError, match="key=value"):
        compare(api, b_changes="quantization")
    with pytest.raises(AppError, match="prefix_caching"):
        compare(api, b_changes="kv_layout=contiguous")
    with pytest.raises(AppError, match="at least one prompt"):
        compare(api, prompts="  \n ")
    with pytest.raises(AppError, match="repeats must be between 1 and 5"):
        compare(api, repeats=9)
    with pytest.raises(AppError, match="surge must be COUNT:INPUT:OUTPUT"):
        compare(api, surge="3:64")
    with pytest.raises(AppError, match="surge input tokens"):
        compare(api, surge="2:5000:4")
    assert compare(api)["labels"] == ["A", "B"]


def test_a_comparison_with_a_surge_reports_the_prompts_token_gaps_during_it(running_app):
    """A surge (the Benchmark's COUNT:INPUT:OUTPUT) goes to both sides once their replies are half streamed; each
    side reports the prompts' token gaps during the surge and outside it and the surge's first tokens, and only
    the prompts' replies are shown as outputs."""
    outcome = compare(client(running_app), max_tokens=24, surge="3:64:4", b_changes="max_num_batched_tokens=32")
    assert outcome["surge"] == {"count": 3, "input_len": 64, "output_len": 4, "after_tokens": 12}
    for label in "AB":
        side = outcome["sides"][label]
        figures = side["figures"]
        assert figures["surge_completed"] == 3 and figures["surge_p99_ttft_ms"] > 0
        assert figures["chat_p99_itl_during_surge_ms"] > 0 and figures["chat_p99_itl_outside_surge_ms"] > 0
        assert len(side["outputs"]) == len(PROMPTS.splitlines())
    assert outcome["ratios"]["B"]["chat_p99_itl_during_surge_ms"] > 0
    assert compare(client(running_app))["surge"] is None


# ----- Benchmark -----------------------------------------------------------------------------


def test_benchmark_report_and_exports_have_the_bench_clis_keys(running_app, tmp_path):
    api = client(running_app)
    report, as_json, as_csv = benchmark(api, requests=6, input_tokens="12", output_tokens="5")
    cli_json = tmp_path / "cli.json"
    assert bench_main(["--set", f"model={running_app.model}", "--num-prompts", "2", "--input-len", "4",
                       "--output-len", "2", "--no-warmup", "--json", str(cli_json)]) == 0
    cli = json.loads(cli_json.read_text())
    exported = json.loads(open(as_json, encoding="utf-8").read())
    assert set(exported) == set(report) == set(cli) | {"config_label"}  # the playground adds its label
    assert set(exported["workload"]) == set(cli["workload"])
    assert exported["mean_ttft_ms"] == pytest.approx(report["mean_ttft_ms"])
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "p90", "p99"):
            assert report[f"{stat}_{name}_ms"] > 0, f"{stat} {name} of a run whose every request made two tokens"
        assert report[f"median_{name}_ms"] <= report[f"p90_{name}_ms"] <= report[f"p99_{name}_ms"]
    assert report["completed"] == 6 and report["total_output_tokens"] == 30 and report["cancelled_requests"] == 0
    assert report["output_throughput"] == pytest.approx(30 / report["duration"])
    assert report["config"]["model"] == running_app.model and report["workload"]["num_prompts"] == 6
    assert report["config_label"] in {config_tag(entry.key) for entry in running_app.app.pool.entries()}
    benchmark(api, requests=3, input_tokens="8", output_tokens="2")
    with open(as_csv, encoding="utf-8") as handle:  # the first run's CSV: one row
        assert len(list(csv.DictReader(handle))) == 1
    _, _, both_csv = benchmark(api, requests=3, input_tokens="8", output_tokens="2", seed=5)
    with open(both_csv, encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 3
    assert {"completed", "output_throughput", "p99_ttft_ms", "config.model", "config_label"} <= set(rows[0])
    assert [int(row["completed"]) for row in rows] == [6, 3, 3]


def test_benchmark_workload_knobs_have_their_effect(running_app):
    api = client(running_app)
    capped, _, _ = benchmark(api, requests=8, concurrency=2, input_tokens="4:24", output_tokens="2:9", seed=1)
    spec = WorkloadSpec(num_prompts=8, input_len=4, input_len_range=(4, 24), output_len=9, output_len_range=(2, 9),
                        seed=1)
    vocab_size = next(iter(running_app.app.pool.entries())).engine.info.vocab_size
    expected = build_workload(spec, vocab_size)
    assert capped["peak_running"] <= 2, "concurrency did not cap requests in flight"
    assert capped["total_input_tokens"] == sum(len(r.prompt) for r in expected)
    assert capped["total_output_tokens"] == sum(r.max_tokens for r in expected)
    assert len({r.max_tokens for r in expected}) > 1
    spread, _, _ = benchmark(api, requests=4, output_tokens="3", request_rate=2.0, seed=2)
    spec = WorkloadSpec(num_prompts=4, input_len=16, output_len=3, request_rate=2.0, seed=2)
    arrivals = [r.arrival for r in build_workload(spec, vocab_size)]
    assert arrivals[-1] > 0.9, "a workload whose last request arrives late, so a burst cannot take as long"
    assert spread["duration"] >= arrivals[-1], "the request rate did not spread the arrivals"
    shared, _, _ = benchmark(api, requests=4, input_tokens="8", prefix_tokens=48, seed=7)
    cold, _, _ = benchmark(api, requests=4, input_tokens="8", prefix_tokens=0, seed=8)
    assert shared["prefix_cache_hit_rate"] > 0.5 and cold["prefix_cache_hit_rate"] == 0.0
    assert shared["total_input_tokens"] == 4 * 56
    loose, _, _ = benchmark(api, requests=4, slo_ttft_ms=1e6, slo_tpot_ms=1e6)
    strict, _, _ = benchmark(api, requests=4, slo_ttft_ms=0.001)
    assert loose["request_goodput"] == pytest.approx(loose["request_throughput"]) and strict["request_goodput"] == 0
    assert loose["workload"]["goodput_slos"] == {"ttft": 1e6, "tpot": 1e6}
    assert benchmark(api, requests=2)[0]["request_goodput"] is None
    stops, _, _ = benchmark(api, dataset="chat", requests=3, output_tokens="64", ignore_eos=False)
    runs_on, _, _ = benchmark(api, dataset="chat", requests=3, output_tokens="64", ignore_eos=True)
    assert runs_on["total_output_tokens"] == 3 * 64 and stops["total_output_tokens"] < 3 * 64
    assert stops["workload"]["dataset"] == "chat"
    surged, _, _ = benchmark(api, requests=2, input_tokens="8", output_tokens="16", surge="2:40:3", seed=3)
    assert surged["surge_completed"] == 2 and surged["chat_completed"] == 2
    assert surged["total_input_tokens"] == 2 * 8 + 2 * 40 and surged["workload"]["surge"]["after_tokens"] == 8
    assert surged["chat_itl_during_surge_count"] + surged["chat_itl_outside_surge_count"] == 2 * 15


def test_benchmark_runs_an_uploaded_jsonl(running_app, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    prompts = tmp_path / "mine.jsonl"
    prompts.write_text("\n".join(json.dumps(line) for line in (
        {"prompt": "Say hello."}, {"messages": [{"role": "user", "content": "What is a list?"}]})) + "\n")
    api = client(running_app)
    report, _, _ = benchmark(api, dataset="upload", upload=handle_file(str(prompts)), requests=4, output_tokens="3")
    assert report["completed"] == 4 and report["total_output_tokens"] == 12
    assert report["workload"]["dataset"].endswith(".jsonl")
    with pytest.raises(AppError, match="jsonl"):
        benchmark(api, dataset="upload", upload=None)
    for line, message in (({"messages": [{"role": "wizard", "content": "hi"}]}, "line 1 .* role among"),
                          ({"messages": [{"role": "user", "content": 5}]}, "content must be text"),
                          ({"prompt": "x" * 2001}, "at most 2,000 characters")):  # as /v1 refuses them
        prompts.write_text(json.dumps(line) + "\n")
        with pytest.raises(AppError, match=message):
            benchmark(api, dataset="upload", upload=handle_file(str(prompts)), requests=1)


def test_cancel_stops_the_benchmark_cleanly_and_leaves_no_request_running(running_app):
    api = client(running_app)
    job = api.submit("random", None, 64, 4, 0, "32", "256", 0, True, 0, 0, 11, api_name="/benchmark")
    deadline = time.monotonic() + 60
    while not any(entry.engine.stats().num_running for entry in running_app.app.pool.entries()):
        assert time.monotonic() < deadline, "the benchmark never started"
        time.sleep(0.05)
    time.sleep(0.5)  # some requests finish, most are in flight or not sent yet
    assert api.predict(api_name="/cancel_benchmark") == "cancelling"
    report, _, _ = job.result(timeout=120)
    assert engines_idle(running_app.app), "a cancelled benchmark left requests in the engine"
    assert 0 < report["cancelled_requests"] <= 64 and report["completed"] + report["cancelled_requests"] == 64
    assert report["completed"] < 64 and report["num_prompts"] == 64
    assert api.predict(api_name="/cancel_benchmark") == "no benchmark is running"
    after, _, _ = benchmark(api, requests=2)  # the next run is whole
    assert after["completed"] == 2 and after["cancelled_requests"] == 0


def test_benchmark_refuses_what_it_cannot_run(running_app):
    from gradio_client.exceptions import AppError

    api = client(running_app)
    with pytest.raises(AppError, match="LO <= HI"):
        benchmark(api, input_tokens="9:3")
    with pytest.raises(AppError, match="requests must be between 1 and"):
        benchmark(api, requests=0)
    with pytest.raises(AppError, match="request rate"):
        benchmark(api, request_rate=-1)
    with pytest.raises(AppError, match="prompt cap"):
        benchmark(api, input_tokens="300", prefix_tokens=300)
    assert not math.isnan(benchmark(api, requests=1)[0]["duration"])
