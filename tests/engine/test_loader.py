"""Resolving and loading models: curated names, local folders, sharded checkpoints, tokenizer-less folders."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from transformers import AutoModelForCausalLM

from engine import (
    Engine,
    EngineConfig,
    ModelLoadError,
    RequestError,
    SamplingParams,
    hold_checkpoint,
    release_checkpoint,
)
from engine.hub import list_models, resolve_model_path
from engine.model.weights import safetensors_files
from tests.support.tiny_models import build_tiny_model


def test_sharded_checkpoint_loads_and_matches(tiny_llama_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert len(safetensors_files(tmp_path)) > 1
    assert (tmp_path / "model.safetensors.index.json").is_file()
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    with Engine(EngineConfig(model=tiny_llama_dir)) as whole, Engine(EngineConfig(model=str(tmp_path))) as sharded:
        assert sharded.generate([4, 5, 6], params)[0].token_ids == whole.generate([4, 5, 6], params)[0].token_ids


def test_folder_without_tokenizer_serves_token_ids_only(tiny_llama_dir):
    with Engine(EngineConfig(model=tiny_llama_dir)) as engine:
        assert engine.tokenizer is None
        assert any("tokenizer" in notice for notice in engine.info.notices)
        assert len(engine.generate([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids) == 4
        with pytest.raises(RequestError, match="token ids"):
            engine.generate("text needs a tokenizer")


def test_missing_weight_is_a_clear_error(tiny_llama_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    shutil.copy(f"{tiny_llama_dir}/config.json", tmp_path / "config.json")
    weights = load_file(f"{tiny_llama_dir}/model.safetensors")
    weights.pop("model.norm.weight")
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="lacks"):
        Engine(EngineConfig(model=str(tmp_path)))


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        resolve_model_path(str(tmp_path))


def test_curated_entry_with_a_missing_folder_says_so(monkeypatch):
    from engine import hub

    monkeypatch.setattr(hub, "list_models", lambda: {"gone": hub.ModelEntry("gone", "assets/models/nothing")})
    with pytest.raises(ModelLoadError, match="curated model 'gone' points to assets/models/nothing"):
        resolve_model_path("gone")


def test_curated_models_are_well_formed():
    """Names with dots must be quoted in TOML, or they silently become nested tables without a source."""
    models = list_models()
    assert models, "presets/models.toml lists the curated models"
    defaults = [m for m in models.values() if m.default]
    assert len(defaults) == 1, "exactly one default model"
    for entry in models.values():
        assert entry.source and entry.label, entry.name
        if entry.draft:
            assert entry.draft in models or "/" in entry.draft, f"{entry.name}: draft {entry.draft} is unknown"


def test_info_describes_the_loaded_model(tiny_model_dirs):
    with Engine(EngineConfig(model=tiny_model_dirs["qwen3-qk-norm"])) as engine:
        info = engine.info
    assert info.architecture == "Qwen3ForCausalLM" and info.backend == "native"
    assert info.num_params == sum(p.numel() for p in
                                     AutoModelForCausalLM.from_pretrained(tiny_model_dirs["qwen3-qk-norm"]).parameters())
    assert info.dtype == "float32" and info.load_seconds > 0
    assert json.dumps(dataclasses.asdict(info))


def test_a_held_checkpoint_is_read_from_memory_until_its_last_release(tiny_llama_dir, tmp_path):
    """hold_checkpoint (ZeroGPU mode's model on the CPU): while held, loads read the tensors held in memory, not the
    files; each hold needs its release, and after the last one loads read the files again. Shown by replacing the
    file with another model's weights while it is held."""
    from safetensors.torch import load_file

    folder, other = tmp_path / "model", tmp_path / "other"
    shutil.copytree(tiny_llama_dir, folder)
    build_tiny_model("llama-gqa", other, seed=1)
    params = SamplingParams(max_tokens=8, ignore_eos=True)

    def greedy(path) -> list[int]:
        with Engine(EngineConfig(model=str(path))) as engine:
            return engine.generate([4, 5, 6], params)[0].token_ids

    original, replaced = greedy(folder), greedy(other)
    assert original != replaced
    held_bytes = sum(t.numel() * t.element_size() for t in load_file(folder / "model.safetensors").values())
    assert hold_checkpoint(folder) == held_bytes
    assert hold_checkpoint(folder) == held_bytes  # a second holder
    try:
        shutil.copy(other / "model.safetensors", folder / "model.safetensors")
        assert greedy(folder) == original
        release_checkpoint(folder)
        assert greedy(folder) == original  # the other holder still holds it
    finally:
        release_checkpoint(folder)
    assert greedy(folder) == replaced
