"""`python -m engine.bench`: end to end on a tiny model, deterministic workloads, shared prefixes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from engine.hub import PROJECT_ROOT, list_models
from engine.overrides import parse_value
from engine.presets import list_presets, load_preset
from engine.tools.bench import build_config, main, portable_report_text, ratios
from engine.tools.workloads import (
    CHAT_PROMPTS_FILE,
    WorkloadSpec,
    build_workload,
    read_jsonl_prompts,
    resolve_dataset,
    warmup_workload,
)
from tests.support.tiny_models import build_tiny_model

REQUIRED_KEYS = {"completed", "duration", "request_throughput", "output_throughput", "total_token_throughput",
                 "weights_bytes", "kv_cache_bytes", "peak_memory_bytes", "prefix_cache_hit_rate",
                 "spec_acceptance_rate", "peak_running", "config"} | {
    f"{stat}_{name}_ms" for stat in ("mean", "median", "p90", "p99") for name in ("ttft", "tpot", "itl", "e2el")}


@pytest.fixture(scope="module")
def bench_model_dir(tmp_path_factory) -> str:
    return build_tiny_model("llama-gqa", tmp_path_factory.mktemp("bench") / "llama")


def test_cli_writes_json_and_compare_ratios(bench_model_dir, tmp_path, capsys):
    out = tmp_path / "result.json"
    code = main(["--set", f"model={bench_model_dir}", "--set", "max_num_seqs=4", "--num-prompts", "4",
                 "--input-len", "8", "--output-len", "5", "--prefix-len", "16", "--compare", "hf-static",
                 "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert REQUIRED_KEYS <= set(report)
    assert report["completed"] == 4 and report["total_output_tokens"] == 20
    assert report["config"]["backend"] == "native" and report["config"]["max_num_seqs"] == 4
    assert REQUIRED_KEYS <= set(report["compare"]) and report["compare"]["config"]["backend"] == "hf"
    assert report["total_input_tokens"] == 4 * (16 + 8)
    # the 16 shared tokens fill one block: computed once, then reused by the 3 other requests (48 of 96 tokens)
    assert report["prefix_cache_hit_rate"] == 0.5
    assert report["compare"]["prefix_cache_hit_rate"] == 0.0 and report["ratios"]["prefix_cache_hit_rate"] == 0.0
    assert report["mean_ttft_ms"] <= report["mean_e2el_ms"]
    printed = capsys.readouterr().out
    assert "compare/base" in printed and "ratios compare/base: output_throughput=" in printed


def test_json_reports_name_no_folder_of_this_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    report = {"model": str(tmp_path / ".cache" / "inference-playground" / "random-llama-20m"),
              "dataset": str(PROJECT_ROOT / "assets" / "models" / "demo-questions.jsonl"), "preset": "continuous"}
    assert json.loads(portable_report_text(report)) == {
        "model": "~/.cache/inference-playground/random-llama-20m",
        "dataset": "./assets/models/demo-questions.jsonl", "preset": "continuous"}


def test_cli_rejects_a_bad_setting(bench_model_dir, capsys):
    assert main(["--set", f"model={bench_model_dir}", "--set", "batching=sometimes", "--num-prompts", "1"]) == 2
    assert "batching" in capsys.readouterr().err


def test_mixed_output_lengths_and_rate(bench_model_dir, tmp_path):
    out = tmp_path / "mixed.json"
    assert main(["--set", f"model={bench_model_dir}", "--num-prompts", "3", "--input-len", "4",
                 "--output-len-range", "2:6", "--request-rate", "50", "--concurrency", "2", "--no-warmup",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["completed"] == 3 and report["workload"]["output_len_range"] == [2, 6]


def test_workload_is_deterministic_by_seed():
    spec = WorkloadSpec(num_prompts=5, input_len=7, output_len_range=(1, 50), request_rate=3.0, seed=11)
    assert build_workload(spec, 1000) == build_workload(spec, 1000)
    other = build_workload(WorkloadSpec(num_prompts=5, input_len=7, output_len_range=(1, 50), request_rate=3.0,
                                        seed=12), 1000)
    assert other != build_workload(spec, 1000)
    offsets = [r.arrival for r in build_workload(spec, 1000)]
    assert offsets[0] == 0.0 and offsets == sorted(offsets) and offsets[-1] > 0


def test_shared_prefix_is_shared_and_suffixes_differ():
    requests = build_workload(WorkloadSpec(num_prompts=4, input_len=6, prefix_len=10, seed=3), 500)
    prompts = [r.prompt for r in requests]
    assert all(len(p) == 16 for p in prompts)
    assert len({tuple(p[:10]) for p in prompts}) == 1
    assert len({tuple(p[10:]) for p in prompts}) == 4
    assert all(r.arrival == 0.0 for r in requests) and all(r.max_tokens == 128 for r in requests)
    warm = warmup_workload(WorkloadSpec(num_prompts=4, input_len=6, prefix_len=10, seed=3), 500)
    assert all(w.prompt[:10] != prompts[0][:10] for w in warm)  # the warm-up must not seed the prefix cache


def test_chat_prompts_and_presets_are_valid():
    prompts = read_jsonl_prompts(CHAT_PROMPTS_FILE)
    assert len(prompts) >= 8 and all(isinstance(p, list) and p[-1]["role"] == "user" for p in prompts)
    for name in set(list_presets()) & {"baseline-hf", "hf-static", "hf-sequential", "continuous", "static",
                                        "prefix-cache", "no-prefix-cache", "paged-kv", "contiguous-kv"}:
        assert build_config(name, {}).backend in ("native", "hf"), name
        assert "description" not in load_preset(name)


def test_parse_value_and_ratios():
    assert parse_value("none") is None and parse_value("true") is True and parse_value("7") == 7
    assert parse_value("64MiB") == 64 * 2**20 and parse_value("0.5") == 0.5 and parse_value("sdpa") == "sdpa"
    assert ratios({"output_throughput": 10.0}, {"output_throughput": 50.0})["output_throughput"] == 5.0
    assert ratios({"output_throughput": 0.0}, {"output_throughput": 5.0})["output_throughput"] is None
    assert math.isinf(WorkloadSpec().request_rate)


def test_goodput_objectives_add_vllms_request_goodput(bench_model_dir, tmp_path, capsys):
    out = tmp_path / "goodput.json"
    assert main(["--set", f"model={bench_model_dir}", "--num-prompts", "3", "--input-len", "4", "--output-len", "3",
                 "--no-warmup", "--goodput", "ttft:100000", "tpot:100000", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["request_goodput"] == pytest.approx(report["request_throughput"])
    assert report["workload"]["goodput_slos"] == {"ttft": 100000.0, "tpot": 100000.0}
    assert main(["--set", f"model={bench_model_dir}", "--num-prompts", "3", "--input-len", "4", "--output-len", "3",
                 "--no-warmup", "--goodput", "e2el:0.001", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["request_goodput"] == 0.0
    assert "request_goodput" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--goodput", "itl:5"])
    assert "METRIC:MS" in capsys.readouterr().err


def test_input_length_ranges_draw_each_prompts_own_length():
    fixed = build_workload(WorkloadSpec(num_prompts=6, input_len=9, prefix_len=4, seed=5), 500)
    ranged = build_workload(WorkloadSpec(num_prompts=6, input_len=9, prefix_len=4, input_len_range=(2, 30), seed=5),
                            500)
    assert {len(r.prompt) for r in fixed} == {13}
    lengths = [len(r.prompt) - 4 for r in ranged]
    assert all(2 <= n <= 30 for n in lengths) and len(set(lengths)) > 1
    assert len({tuple(r.prompt[:4]) for r in ranged}) == 1, "the shared prefix stays shared"
    with pytest.raises(SystemExit):
        main(["--input-len-range", "5:1"])


def test_the_chat_dataset_asks_the_demo_model_what_it_was_taught_and_other_models_the_general_set():
    demo_file = resolve_dataset("chat", "demo")
    assert demo_file.endswith(list_models()["demo"].chat_prompts)
    taught = build_workload(WorkloadSpec(dataset=demo_file, num_prompts=3), 0)
    assert [r.prompt for r in taught] == read_jsonl_prompts(Path(demo_file))[:3]
    graded = json.loads((Path(demo_file).parent / "build.json").read_text())["trained_answers"]
    assert [p[0]["content"] for p in read_jsonl_prompts(Path(demo_file))] == [a["question"] for a in graded]
    general = read_jsonl_prompts(CHAT_PROMPTS_FILE)
    assert resolve_dataset("chat", "smollm2-135m") == "chat" and resolve_dataset("chat", "/some/folder") == "chat"
    assert resolve_dataset("random", "demo") == "random"
    assert not set(map(str, general)) & set(map(str, read_jsonl_prompts(Path(demo_file))))
