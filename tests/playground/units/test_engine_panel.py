"""The engine panel's answers before anything loads: where a model comes from and whether loading it needs the
network, and the check line that shows what Apply would load (the engine's plan), never downloading."""

from __future__ import annotations

import pytest

from engine import EngineConfig, ModelLoadError, hub_repo, plan_engine
from playground.app import create_playground
from playground.engine_panel.availability import availability_note, hub_cache_bytes, hub_cache_state, needs_download
from playground.engine_panel.choices import RADIO_FIELDS, help_line
from playground.engine_panel.form import config_to_form, parse_form
from playground.engine_panel.handlers import PanelHandlers
from playground.engine_panel.plan_preview import apply_preview, plan_summary
from playground.engine_panel.views import loaded_title
from playground.shared.loading import LoadOutcome
from playground.shared.settings import Settings
from tests.support.reference_figures import engine_info


def test_hub_models_are_told_apart_by_whether_the_local_cache_holds_them(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--org--cached"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "blobs").mkdir()
    (repo / "blobs" / "weights.incomplete").write_bytes(b"x" * 1000)
    assert hub_cache_state("org/cached") == "partial" and hub_cache_bytes("org/cached") == 1000
    (snapshot / "model.safetensors").write_bytes(b"")
    assert hub_cache_state("org/cached") == "cached" and hub_cache_state("org/absent") == "missing"
    assert hub_repo("demo") is None and hub_repo("org/absent") == "org/absent"  # the demo model is bundled
    assert "no network needed" in availability_note("org/cached") and "no network needed" in availability_note("demo")
    assert "needs the network" in availability_note("org/absent")
    assert needs_download("org/absent") and not needs_download("org/cached") and not needs_download("demo")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert "cannot load" in availability_note("org/absent")


def test_the_check_line_shows_what_apply_would_load_once_per_configuration(tiny_llama_dir):
    config = EngineConfig(model=tiny_llama_dir, kv_layout="contiguous", prefix_caching=False, max_model_len=256)
    expected = plan_engine(config, download=False).summary()
    assert apply_preview(config) == expected and "contiguous" in expected and "context 256" in expected
    hits = plan_summary.cache_info().hits
    assert apply_preview(config.replace()) == expected  # an equal configuration is not planned again
    assert plan_summary.cache_info().hits == hits + 1

    panel = PanelHandlers(create_playground(Settings(), default_model=tiny_llama_dir, models={}))
    session = panel.context.new_session()
    line, applicable = panel.check_line(config, session)
    assert applicable and "not loaded yet · press Apply" in line and f'<div class="check-plan">{expected}' in line
    line, applicable = panel.check_line(session.config, session)
    assert applicable and "this is the active configuration" in line and "check-plan" in line


def test_a_configuration_its_checkpoint_refuses_cannot_be_applied(tiny_llama_dir):
    """The tiny model has 512 positions: a longer context validates as a configuration but its plan refuses it."""
    panel = PanelHandlers(create_playground(Settings(), default_model=tiny_llama_dir, models={}))
    line, applicable = panel.check_line(EngineConfig(model=tiny_llama_dir, max_model_len=1024),
                                        panel.context.new_session())
    assert not applicable and 'class="check bad"' in line and "max_model_len=1024 exceeds" in line


def test_a_hub_model_not_in_the_local_cache_is_named_not_downloaded(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    config = EngineConfig(model="org/not-here")
    assert apply_preview(config) == "will be downloaded on Apply: org/not-here (not in the local cache yet)"
    assert not any(tmp_path.iterdir()), "a check fetched files"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="not in the local cache"):  # offline, Apply could not fetch it either
        apply_preview(config)


def test_the_kv_cache_precision_control_sets_the_field_the_plan_sizes_the_pool_by(tiny_llama_dir):
    """The panel's kv_cache_dtype radio becomes the configuration's field, and the check line shows the pool Apply
    would allocate: int8 rows (16 values and a 4-byte scale here) hold 3.2x the blocks of float32's 64 bytes."""
    assert "kv_cache_dtype" in RADIO_FIELDS
    assert "3.8x the tokens" in help_line("kv_cache_dtype", "int8")
    form = config_to_form(EngineConfig(model=tiny_llama_dir, kv_cache_bytes=2**20).to_dict(), [])
    lines = {}
    for value in ("auto", "int8"):
        config = EngineConfig.from_dict(parse_form({**form, "kv_cache_dtype": value}, {}))
        assert config.kv_cache_dtype == value
        lines[value] = apply_preview(config)
    assert "float32)" in lines["auto"] and "int8)" in lines["int8"]
    blocks = {value: int(line.split(" KV blocks")[0].split(" · ")[-1].replace(",", ""))
              for value, line in lines.items()}
    assert blocks["int8"] == 2**20 // (2 * 2 * 2 * 20 * 16) and blocks["auto"] == 2**20 // (2 * 2 * 2 * 64 * 16)


def test_apply_names_the_warm_up_within_its_load_time():
    outcome = LoadOutcome(engine_info(warmup_seconds=0.4), None, 2.5, EngineConfig())
    assert loaded_title(outcome, shared=False) == "Loaded in 2.5 s (0.4 s of it warming the loaded level's kernels up)"
    assert "its load took 2.5 s, 0.4 s of it warming" in loaded_title(outcome, shared=True)
