"""Configurations from the engine panel's values, presets as written, and the public caps on memory-sizing fields."""

from __future__ import annotations

import pytest

from engine import EngineConfig, list_presets, load_preset
from playground.engine_panel.form import FORM_FIELDS, config_to_form, extras_of, parse_form
from playground.shared.configs import preset_config
from playground.shared.context import enforce_caps
from playground.shared.errors import Refused
from playground.shared.settings import Settings


def test_form_round_trips_every_field_of_a_configuration():
    config = EngineConfig(kv_layout="contiguous", prefix_caching=False, block_size=32, kv_cache_bytes=64 * 2**20,
                          max_num_batched_tokens=512, max_model_len=256, seed=7, batching="static",
                          kv_cache_dtype="int8").to_dict()
    form = config_to_form(config, ["demo"])
    assert set(form) == set(FORM_FIELDS)
    assert parse_form(form, extras_of(config)) == config


@pytest.mark.parametrize("field,value,message", [
    ("kv_cache_mib", float("nan"), "finite"), ("kv_cache_mib", "lots", "number"), ("kv_cache_mib", -5, "positive"),
    ("max_num_seqs", 2.5, "whole"), ("max_num_seqs", 0, "between"), ("max_num_seqs", [1], "number"),
    ("block_size", None, "number"), ("backend", ["native"], "one of"), ("dtype", "float64", "one of"),
    ("prefix_caching", "yes", "true or false"), ("model", 12, "text"), ("custom_model", "x" * 400, "longer"),
    ("seed", 2**64, "between"), ("gqa", "some", "number"), ("max_model_len", 1, "at least 2"),
    ("kv_cache_dtype", "fp8", "one of"),
])
def test_form_refuses_what_no_control_can_produce(field, value, message):
    form = config_to_form(EngineConfig().to_dict(), ["demo"])
    with pytest.raises(Refused, match=message):
        parse_form({**form, field: value}, {})


def test_preset_is_applied_as_written_not_layered_on_the_panel():
    sequential = preset_config("hf-sequential", "demo", list_presets())
    assert (sequential["backend"], sequential["batching"], sequential["max_num_seqs"]) == ("hf", "static", 1)
    for name in ("static", "paged-kv", "prefix-cache", "no-prefix-cache", "hf-static"):
        after = preset_config(name, "demo", list_presets())
        assert after["max_num_seqs"] == EngineConfig().max_num_seqs, f"{name} kept hf-sequential's max_num_seqs"
        assert after == {**EngineConfig().to_dict(), **load_preset(name), "model": "demo"}
    assert preset_config("static", "smollm2-135m", list_presets())["model"] == "smollm2-135m"


def test_preset_names_only_not_paths():
    for name in ("../presets/static", "/etc/hosts.toml", "presets/static.toml", None, 3):
        with pytest.raises(Refused, match="no preset"):
            preset_config(name, "demo", list_presets())


def test_public_caps_bound_every_memory_sizing_field():
    settings = Settings(public=True, max_num_seqs=8, max_num_batched_tokens=512, max_model_len=256)
    ok = EngineConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=256, kv_cache_bytes=16 * 2**20)
    enforce_caps(ok, settings, 16 * 2**20)
    for field, value, variable in (("max_num_seqs", 9, "PLAYGROUND_MAX_NUM_SEQS"),
                                   ("max_num_batched_tokens", 513, "PLAYGROUND_MAX_BATCHED_TOKENS"),
                                   ("max_model_len", 257, "PLAYGROUND_MAX_MODEL_LEN"),
                                   ("kv_cache_bytes", 17 * 2**20, "PLAYGROUND_MAX_KV_CACHE_MIB")):
        with pytest.raises(Refused, match=variable):
            enforce_caps(ok.replace(**{field: value}), settings, 16 * 2**20)
