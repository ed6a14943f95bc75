"""The vLLM / SGLang export: every preset, both targets, every field given a decision."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest

from engine.config import EngineConfig
from engine.errors import ConfigError
from engine.presets import list_presets, load_preset
from engine.tools.bench import main
from engine.tools.export import TARGETS, export_command, format_export

PRESETS = list_presets()


def _check_every_field(config: EngineConfig, target: str) -> None:
    result = export_command(config, target)
    argv = [token for command in result.commands for token in command.argv]
    rows = {row.field: row for row in result.rows}
    for field in dataclasses.fields(EngineConfig):  # a new field without a mapping decision fails here
        assert field.name in rows, f"{field.name} has no export row for {target}"
        row = rows[field.name]
        if row.unmapped:
            assert row.note, f"{field.name} is unmapped without a reason"
            assert row in result.unmapped
        elif row.flag and field.name != "model":
            assert row.flag.split()[0] in argv, (field.name, row.flag)
        elif getattr(config, field.name) != field.default and field.name != "model":
            assert row.note, f"{field.name} differs from its default but says nothing for {target}"
    for command in result.commands:
        assert shlex.split(command.shell) == list(command.argv)


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_maps_or_names_every_field(preset, target):
    config = EngineConfig.from_dict(load_preset(preset))
    _check_every_field(config, target)
    text = format_export(export_command(config, target))
    assert TARGETS[target].version in text


def test_sizes_and_batching_flags():
    config = EngineConfig(max_num_seqs=7, max_num_batched_tokens=512, max_model_len=1024, seed=3, block_size=32)
    vllm = export_command(config, "vllm").argv
    sglang = export_command(config, "sglang").argv
    assert vllm[:2] == ["vllm", "serve"]
    for flag, value in (("--max-num-seqs", "7"), ("--max-num-batched-tokens", "512"), ("--max-model-len", "1024"),
                        ("--seed", "3"), ("--block-size", "32"), ("--tensor-parallel-size", "1"),
                        ("--pipeline-parallel-size", "1")):
        assert vllm[vllm.index(flag) + 1] == value
    assert sglang[:3] == ["python", "-m", "sglang.launch_server"]
    for flag, value in (("--max-running-requests", "7"), ("--chunked-prefill-size", "512"),
                        ("--context-length", "1024"), ("--random-seed", "3"), ("--page-size", "32"),
                        ("--tp-size", "1"), ("--pp-size", "1")):
        assert sglang[sglang.index(flag) + 1] == value


def test_prefix_caching_off_and_dtype():
    config = EngineConfig(prefix_caching=False, dtype="bfloat16", cuda_graphs=False)
    vllm = export_command(config, "vllm").argv
    sglang = export_command(config, "sglang").argv
    assert "--no-enable-prefix-caching" in vllm and "--enable-prefix-caching" not in vllm
    assert "--disable-radix-cache" in sglang
    assert vllm[vllm.index("--dtype") + 1] == "bfloat16" == sglang[sglang.index("--dtype") + 1]
    assert "--enforce-eager" in vllm and "--disable-cuda-graph" in sglang
    assert "--enable-prefix-caching" in export_command(EngineConfig(), "vllm").argv
    assert "--disable-radix-cache" not in export_command(EngineConfig(), "sglang").argv


def test_ngram_speculation():
    config = EngineConfig.from_dict(load_preset("speculative-ngram"))
    vllm = export_command(config, "vllm").argv
    spec = json.loads(vllm[vllm.index("--speculative-config") + 1])
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == config.num_speculative_tokens
    assert spec["prompt_lookup_min"] <= spec["prompt_lookup_max"]
    sglang = export_command(config, "sglang").argv
    assert sglang[sglang.index("--speculative-algorithm") + 1] == "NGRAM"
    assert sglang[sglang.index("--speculative-num-draft-tokens") + 1] == str(config.num_speculative_tokens)


def test_draft_speculation_names_the_draft():
    config = EngineConfig.from_dict(load_preset("speculative-draft"))
    sglang = export_command(config, "sglang").argv
    assert sglang[sglang.index("--speculative-algorithm") + 1] == "STANDALONE"
    assert sglang[sglang.index("--speculative-draft-model-path") + 1].endswith("demo-draft")
    vllm = export_command(config, "vllm")
    assert vllm.row("speculative").unmapped and "--speculative-config" not in vllm.argv


def test_hub_model_and_local_folder():
    result = export_command(EngineConfig(model="smollm2-135m"), "vllm")
    assert result.argv[2] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    demo = export_command(EngineConfig(), "sglang")
    assert demo.argv[demo.argv.index("--model-path") + 1].endswith("demo-chat")
    assert "reachable" in demo.row("model").note or "copy it" in demo.row("model").note


def test_unmapped_settings_are_named_not_silently_dropped():
    config = EngineConfig(kv_cache_dtype="int8", batching="static", kv_layout="contiguous", prefix_caching=False,
                          cpu_kernels=False)
    for target in TARGETS:
        result = export_command(config, target)
        unmapped = {row.field for row in result.unmapped}
        assert {"kv_cache_dtype", "batching", "kv_layout", "cpu_kernels"} <= unmapped
        assert "fp8" in result.row("kv_cache_dtype").note
        assert "--kv-cache-dtype" not in result.argv
        assert "Not mapped" in format_export(result)


def test_disaggregation_gives_two_servers():
    config = EngineConfig(disaggregation="prefill-decode")
    sglang = export_command(config, "sglang")
    assert [c.role for c in sglang.commands] == ["prefill", "decode"]
    for command in sglang.commands:
        argv = list(command.argv)
        assert argv[argv.index("--disaggregation-mode") + 1] == command.role
    assert any("router" in note for note in sglang.notes)
    vllm = export_command(config, "vllm")
    assert len(vllm.commands) == 2
    for command in vllm.commands:
        argv = list(command.argv)
        assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector"] == "NixlConnector"
    _check_every_field(config, "sglang")


def test_unknown_target_is_refused():
    with pytest.raises(ConfigError, match="unknown export target 'tgi'.*vllm"):
        export_command(EngineConfig(), "tgi")


def test_cli(capsys):
    assert main(["--export", "vllm", "--preset", "no-prefix-cache", "--set", "max_num_seqs=4"]) == 0
    out = capsys.readouterr().out
    assert "vllm serve" in out and "--no-enable-prefix-caching" in out and "--max-num-seqs 4" in out
    with pytest.raises(SystemExit) as refused:
        main(["--export", "sglang", "--set", "block_size=3"])
    assert refused.value.code == 2 and "block_size" in capsys.readouterr().err
