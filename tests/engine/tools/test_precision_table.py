"""The benchmark tools report quality beside speed: `--perplexity` and `python -m engine.precision_table`."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import engine.config
from engine import Engine, EngineConfig, SamplingParams, WorkloadSpec
from engine.core.perplexity import NextTokenLoss
from engine.overrides import parse_sets
from engine.tools.bench import main as bench_main
from engine.tools.precision_table import QUALITY_CHUNK_TOKENS, _timed_run, default_rows, held_out_quality
from engine.tools.precision_table import main as table_main


def test_bench_perplexity_is_printed_and_written(tiny_chat_dir, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench_main(["--set", f"model={tiny_chat_dir}", "--num-prompts", "2", "--input-len", "4",
                       "--output-len", "3", "--perplexity", "--compare", "continuous",
                       "--compare-set", "quantization=nf4", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["perplexity"] > 1 and report["perplexity_tokens"] > 10_000
    assert report["compare"]["quantization"] == "nf4" and report["compare"]["perplexity"] != report["perplexity"]
    assert report["ratios"]["weights_bytes"] < 1
    assert "perplexity" in capsys.readouterr().out


def test_set_keeps_a_choice_spelled_like_none():
    assert parse_sets(["quantization=none", "kv_cache_bytes=none", "gqa=2"]) == {
        "quantization": "none", "kv_cache_bytes": None, "gqa": 2}


def test_table_rows_cover_levels_and_kv_heads(tiny_chat_dir, tmp_path):
    rows = default_rows("demo", "cpu")
    assert {"quantization": "none"} in rows and {"quantization": "nf4"} in rows
    assert {"quantization": "torchao-int4"} not in rows  # CUDA only
    assert [row["gqa"] for row in rows if "gqa" in row] == [8, 4, 2, 1]
    out = tmp_path / "table.json"
    assert table_main(["--model", tiny_chat_dir, "--row", "quantization=none", "--row", "gqa=1",
                       "--batch1-prompts", "1", "--concurrency", "2", "--input-len", "4", "--output-len", "3",
                       "--kv-cache-bytes", "1MiB", "--json", str(out)]) == 0
    none, mqa = json.loads(out.read_text())["rows"]
    assert mqa["kv_bytes_per_token"] * 2 == none["kv_bytes_per_token"]  # 2 KV heads -> 1
    assert mqa["kv_blocks"] >= 2 * none["kv_blocks"] and mqa["weights_ratio"] < 1
    assert none["perplexity"] > 1 and mqa["perplexity"] != none["perplexity"]
    assert none["kl_vs_none"] == 0 and none["top1_agreement"] == 1 and none["greedy_agreement"] == 1
    assert mqa["kl_vs_none"] > 0 and mqa["top1_agreement"] < 1


def test_markdown_table_names_the_quality_columns():
    from engine.tools.precision_table import format_table

    header = format_table([]).splitlines()[0]
    assert "KL vs none" in header and "top-1 agree" in header and "greedy agree" in header


def test_kv_dtype_rows_follow_the_configurations_options(monkeypatch):
    """A row per KV cache dtype the configuration offers but "auto", after the level and KV-head rows."""
    rows = default_rows("demo", "cpu")
    kv_rows = [row for row in rows if "kv_cache_dtype" in row]
    offered = engine.config.CHOICES["kv_cache_dtype"]
    assert kv_rows == [{"kv_cache_dtype": value} for value in offered if value != "auto"]
    assert rows[-len(kv_rows):] == kv_rows
    monkeypatch.setitem(engine.config.CHOICES, "kv_cache_dtype", ["auto", "int8"])
    assert [row for row in default_rows("demo", "cpu") if "kv_cache_dtype" in row] == [{"kv_cache_dtype": "int8"}]


def test_held_out_quality_against_a_direct_computation(tiny_chat_dir):
    """KL(p_ref || p_row) and top-1 agreement equal a direct computation from each engine's own windows, scored in
    steps of QUALITY_CHUNK_TOKENS as the table scores them; the reference against itself is 0 and 1, and the
    perplexity is each engine's own over those windows."""
    base = dict(model=tiny_chat_dir, dtype="float32", kv_cache_bytes=2**22)
    with Engine(EngineConfig(**base)) as reference, Engine(EngineConfig(**base, gqa=1)) as pooled:
        figures = held_out_quality({0: reference, 1: pooled}, 0)
        windows = [list(engine.next_token_log_probs(chunk_tokens=QUALITY_CHUNK_TOKENS))
                   for engine in (reference, pooled)]
    perplexities = []
    for engine_windows in windows:
        loss = NextTokenLoss()
        for window in engine_windows:
            loss.add(window)
        perplexities.append(loss.perplexity)
    ref, row = (torch.cat([w.log_probs.double() for w in engine_windows]) for engine_windows in windows)
    kl = (ref.exp() * (ref - row)).sum(-1).mean().item()
    top1 = (ref.argmax(-1) == row.argmax(-1)).double().mean().item()
    assert figures[0]["kl_vs_none"] == 0 and figures[0]["top1_agreement"] == 1
    assert figures[1]["kl_vs_none"] == pytest.approx(kl, rel=1e-9) and kl > 0
    assert figures[1]["top1_agreement"] == pytest.approx(top1) and top1 < 1
    assert F.kl_div(row, ref, log_target=True, reduction="batchmean").item() == pytest.approx(kl, rel=1e-9)
    assert [figures[0]["perplexity"], figures[1]["perplexity"]] == pytest.approx(perplexities, rel=1e-12)


def test_table_times_a_checkpoint_without_a_tokenizer(tiny_llama_dir, tmp_path):
    """Random hub-shaped checkpoints (`make gpu-check`'s decode model) have token ids but no text to score."""
    out = tmp_path / "table.json"
    assert table_main(["--model", tiny_llama_dir, "--row", "quantization=none", "--batch1-prompts", "1",
                       "--concurrency", "2", "--input-len", "4", "--output-len", "3", "--rounds", "1",
                       "--kv-cache-bytes", "1MiB", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert "error" not in row and row["batch1_tpot_ms"] > 0 and row.get("perplexity") is None


def test_gpu_check_leaves_out_the_levels_it_is_told_to_skip():
    """`python -m engine.gpu_check --skip-levels` (e.g. a level that compiles CUDA kernels for minutes)."""
    from engine.tools.gpu_check import precision_rows

    skipped = {"quanto-int4", "torchao-int4"}
    demo, decode = precision_rows(set())
    demo_skipped, decode_skipped = precision_rows(skipped)
    assert {"quantization": "quanto-int4"} in demo and {"quantization": "torchao-int4"} in decode
    assert demo_skipped == [row for row in demo if row.get("quantization") not in skipped] != demo
    assert decode_skipped == [row for row in decode if row["quantization"] not in skipped] != decode
    assert {"gqa": 1} in demo_skipped and {"quantization": "none"} in decode_skipped


def test_gpu_check_times_every_prefill_gemm_of_the_decode_model_on_the_sparse_kernels(monkeypatch):
    """`make gpu-check`'s 2:4 GEMMs: the 1.7B model's four fused layers, each a shape the sparse kernels take (so
    none is skipped on the GPU for a reason a CPU could have caught)."""
    from engine.quant.sparsity import dense_reason
    from engine.tools.gpu_check import DECODE_MODEL, decode_model_gemms

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    gemms = decode_model_gemms()
    assert gemms["gate_up_proj"] == (2 * DECODE_MODEL["intermediate_size"], DECODE_MODEL["hidden_size"])
    assert gemms["qkv_proj"] == (4096 + 2 * 1024, 4096)
    assert all(dense_reason(out, inputs, torch.bfloat16, "cuda") is None for out, inputs in gemms.values())


def test_a_row_is_timed_once_the_other_rows_loops_have_ended(tiny_llama_dir):
    """Another engine's live loop thread keeps an OpenMP pool that halves a timed engine's speed on a small CPU
    (quiet_other_engines): with every row loaded, each row's run waits for the others' loops to end."""
    config = EngineConfig(model=tiny_llama_dir, max_num_seqs=2, max_model_len=512)
    with Engine(config) as timed, Engine(config) as other:
        other.generate([[5, 6, 7]], SamplingParams(max_tokens=2, temperature=0))
        assert not other.wait_idle(0)
        _timed_run(timed, WorkloadSpec(num_prompts=1, input_len=4, output_len=2), 1, warm_up=False)
        assert other.wait_idle(0)
