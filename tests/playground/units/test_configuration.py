"""Configuration labels: every field that differs from the defaults is named, for every preset and every
quantization / KV precision / GQA / speculative / tensor-parallel choice, so two configurations never share one."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from engine import CHOICES, EngineConfig
from engine.presets import list_presets, load_preset
from playground.engine_panel.choices import GQA_CHOICES, TP_CHOICES, engine_value
from playground.figures.configuration import config_summary, config_tag
from playground.figures.units import format_bytes
from tests.support.reference_figures import engine_info

# A value other than the default for every EngineConfig field, and the words the label must show for it.
# A field added to EngineConfig without a row here fails test_every_field_has_a_sample.
SAMPLES = {
    "backend": ("hf", "hf"), "device": ("cuda", "cuda"), "dtype": ("bfloat16", "bfloat16"),
    "quantization": ("nf4", "nf4"), "attention": ("sdpa", "sdpa"), "kv_layout": ("contiguous", "contiguous"),
    "block_size": (32, "32"), "prefix_caching": (False, "no prefix cache"),
    "kv_cache_bytes": (64 << 20, format_bytes(64 << 20)), "kv_memory_fraction": (0.5, "0.5"),
    "kv_cache_dtype": ("int8", "KV int8"), "batching": ("static", "static"), "max_num_seqs": (8, "8"),
    "max_num_batched_tokens": (512, "512"), "max_model_len": (256, "256"), "speculative": ("ngram", "spec ngram k=4"),
    "draft_model": ("demo-draft", "demo-draft"), "num_speculative_tokens": (6, "k=6"), "gqa": (4, "GQA 4"),
    "tensor_parallel_size": (2, "TP 2"), "pipeline_parallel_size": (2, "PP 2"),
    "pipeline_micro_batches": (4, "4 micro-batches"), "pipeline_schedule": ("flush", "pipeline flush"),
    "disaggregation": ("prefill-decode", "disaggregated P/D"), "seed": (7, "7"),
    "cuda_graphs": (False, "no CUDA graphs"),
    "cpu_kernels": (False, "no CPU kernels"),
    "gguf_type": ("q8_0", "GGUF q8_0"),
    "remote_url": ("http://10.1.2.3:8000/v1", "at 10.1.2.3:8000/v1"), "remote_model": ("served-name", "as served-name"),
    "remote_api_key_env": ("SERVER_KEY", "key $SERVER_KEY"),
}


def unchecked(**changes) -> EngineConfig:
    """A configuration with `changes`, not validated: a label must not depend on what this host can run."""
    config = object.__new__(EngineConfig)
    for field in dataclasses.fields(EngineConfig):
        object.__setattr__(config, field.name, changes.get(field.name, field.default))
    return config


def differing_fields(config: EngineConfig) -> dict:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(EngineConfig)
            if f.name != "model" and getattr(config, f.name) != f.default}


def test_every_field_has_a_sample():
    assert set(SAMPLES) == {f.name for f in dataclasses.fields(EngineConfig)} - {"model"}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_field_that_differs_is_named(name):
    value, words = SAMPLES[name]
    label = config_tag(unchecked(**{name: value}))
    assert label != config_tag(unchecked()) and words in label, label


def configurations() -> list[EngineConfig]:
    """Every preset, then each quantization level, KV precision, GQA, speculative and tensor-parallel choice."""
    configs = [unchecked(**load_preset(name)) for name in list_presets()]
    configs += [unchecked(quantization=level) for level in CHOICES["quantization"]]
    configs += [unchecked(kv_cache_dtype=dtype) for dtype in CHOICES["kv_cache_dtype"]]
    configs += [unchecked(gqa=engine_value(gqa)) for gqa in GQA_CHOICES]
    configs += [unchecked(tensor_parallel_size=size) for size in TP_CHOICES]
    configs += [unchecked(speculative=method, num_speculative_tokens=k)
                for method, k in itertools.product(CHOICES["speculative"], (1, 4, 8))]
    configs += [unchecked(**load_preset("native-int8"), kv_cache_dtype="int8", gqa=2, tensor_parallel_size=2)]
    return configs


def test_configurations_that_differ_get_different_labels_naming_each_difference():
    labels: dict[str, dict] = {}
    for config in configurations():
        label, fields = config_tag(config), differing_fields(config)
        assert labels.setdefault(label, fields) == fields, f"{label!r} names two configurations"
        for name, value in fields.items():
            assert str(value) in label or SAMPLES[name][1] in label, (name, value, label)
    assert len(labels) > len(list_presets())


def test_the_label_reads_in_compact_words():
    assert config_tag(EngineConfig()) == "demo · defaults"
    assert config_tag(unchecked(quantization="int8", kv_cache_dtype="int8", gqa=4, tensor_parallel_size=2,
                                speculative="ngram")) == "demo · int8 · KV int8 · spec ngram k=4 · GQA 4 · TP 2"


def test_the_header_line_starts_with_the_label_and_says_how_it_runs():
    native = EngineConfig()
    assert config_summary(native, engine_info(attention="sdpa")).startswith("demo · defaults — native backend")
    assert "paged KV/16 + prefix cache" in config_summary(native, engine_info(attention="sdpa"))
    hf_static = EngineConfig(backend="hf", batching="static", max_num_seqs=1)
    summary = config_summary(hf_static, engine_info(backend="hf", attention="transformers sdpa"))
    assert summary.startswith("demo · hf · static · ×1 seqs — ") and "generate static ×1" in summary
    assert "paged" not in summary and "attention transformers sdpa" in summary
    hf_continuous = EngineConfig(backend="hf")
    assert "transformers paged KV/16 + block sharing" in config_summary(hf_continuous, engine_info(backend="hf"))
    int8_kv = EngineConfig(kv_cache_dtype="int8")
    assert config_summary(int8_kv, engine_info(kv_cache_dtype="int8")).startswith("demo · KV int8 — ")
