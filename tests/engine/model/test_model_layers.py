"""Layer-owned weight loading: fused and sharded layers take the right slices; the walker refuses bad checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import Engine, EngineConfig, ModelLoadError, SamplingParams
from engine.model.linear import (
    BuildContext,
    HeadLayout,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    UnquantizedLinearMethod,
)
from engine.model.parallel import ParallelContext
from engine.model.weights import safetensors_files

HIDDEN, HEAD_DIM = 8, 2


def build(rank: int, size: int) -> BuildContext:
    return BuildContext(torch.float32, "cpu", ParallelContext(rank, size))


def test_qkv_shards_concatenate_to_the_full_projection():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n * HEAD_DIM, HIDDEN, generator=generator) for n in (4, 2, 2))
    x = torch.randn(3, HIDDEN, generator=generator)
    outputs = []
    for rank in range(2):
        layer = QKVParallelLinear(HIDDEN, HeadLayout(4, 2, HEAD_DIM, ParallelContext(rank, 2)), False,
                                  build(rank, 2), "qkv")
        for part, tensor in zip("qkv", (q, k, v), strict=True):
            layer.weight.weight_loader(layer.weight, tensor, part)
        outputs.append(layer(x).split([layer.q_size, layer.kv_size, layer.kv_size], -1))
    for index, full in enumerate((q, k, v)):
        assert torch.allclose(torch.cat([out[index] for out in outputs], -1), x @ full.T, atol=1e-6)


def test_fewer_kv_heads_than_ranks_are_replicated():
    k = torch.arange(HEAD_DIM * HIDDEN, dtype=torch.float32).view(HEAD_DIM, HIDDEN)
    for rank in range(4):
        layer = QKVParallelLinear(HIDDEN, HeadLayout(4, 1, HEAD_DIM, ParallelContext(rank, 4)), False,
                                  build(rank, 4), "qkv")
        layer.weight.weight_loader(layer.weight, k, "k")
        assert torch.equal(layer.weight[layer.q_size:layer.q_size + layer.kv_size], k)
    with pytest.raises(ValueError, match="divide"):
        HeadLayout(6, 2, HEAD_DIM, ParallelContext(0, 4))


def test_merged_and_row_parallel_shards_sum_to_the_full_mlp():
    generator = torch.Generator().manual_seed(1)
    gate, up = torch.randn(6, HIDDEN, generator=generator), torch.randn(6, HIDDEN, generator=generator)
    down = torch.randn(HIDDEN, 6, generator=generator)
    x = torch.randn(2, HIDDEN, generator=generator)
    expected = (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T
    total = torch.zeros_like(expected)
    for rank in range(2):
        merged = MergedColumnParallelLinear(HIDDEN, [6, 6], False, build(rank, 2), "gate_up")
        merged.weight.weight_loader(merged.weight, gate, 0)
        merged.weight.weight_loader(merged.weight, up, 1)
        row = RowParallelLinear(6, HIDDEN, False, build(rank, 2), "down")
        row.weight.weight_loader(row.weight, down, None)
        g, u = merged.method.apply(merged, x, None).chunk(2, -1)
        total += row.method.apply(row, torch.nn.functional.silu(g) * u, None)  # all-reduce by hand
    assert torch.allclose(total, expected, atol=1e-5)


class CountingMethod(UnquantizedLinearMethod):
    """A stand-in quantization method: proves layers use whatever method the build context picks."""

    def __init__(self, log: list[str]):
        self.log = log

    def process_weights_after_loading(self, layer) -> None:
        self.log.append(layer.prefix)

    def apply(self, layer, x, bias):
        return super().apply(layer, x, bias) * 0


def test_build_context_chooses_each_linear_layers_method(tiny_llama_dir):
    from transformers import AutoConfig

    from engine.model.attention import make_attention
    from engine.model.spec import ModelSpec
    from engine.runner.build import build_native_model

    hf_config = AutoConfig.from_pretrained(tiny_llama_dir)
    spec = ModelSpec.from_hf_config(hf_config)
    finished: list[str] = []
    method = CountingMethod(finished)
    context = BuildContext(torch.float32, "cpu", linear_method=lambda prefix: method if "mlp" in prefix
                           else UnquantizedLinearMethod())
    model = build_native_model(spec, hf_config, Path(tiny_llama_dir), context,
                               make_attention("sdpa", spec.head_dim, 16), 64)
    assert sorted(finished) == sorted(f"model.layers.{i}.mlp.{name}" for i in range(spec.num_layers)
                                      for name in ("gate_up_proj", "down_proj"))
    mlp = model.model.layers[0].mlp
    assert not mlp(torch.randn(2, spec.hidden_size)).any(), "the layer computed with the chosen method"


def copy_checkpoint(source: str, target) -> dict:
    shutil.copytree(source, target)
    return load_file(str(target / "model.safetensors"))


def test_the_walker_refuses_unexpected_missing_and_misshapen_weights(tiny_llama_dir, tmp_path):
    tensors = copy_checkpoint(tiny_llama_dir, tmp_path / "extra")
    save_file({**tensors, "model.layers.0.mystery.weight": torch.zeros(2)}, str(tmp_path / "extra/model.safetensors"))
    with pytest.raises(ModelLoadError, match="unexpected weight"):
        Engine(EngineConfig(model=str(tmp_path / "extra")))
    tensors = copy_checkpoint(tiny_llama_dir, tmp_path / "missing")
    del tensors["model.layers.1.self_attn.v_proj.weight"]
    save_file(tensors, str(tmp_path / "missing/model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"lacks 1 weight.*qkv_proj.weight:v"):
        Engine(EngineConfig(model=str(tmp_path / "missing")))
    tensors = copy_checkpoint(tiny_llama_dir, tmp_path / "shape")
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"][:-1]
    save_file(tensors, str(tmp_path / "shape/model.safetensors"))
    with pytest.raises(ModelLoadError, match="up_proj"):
        Engine(EngineConfig(model=str(tmp_path / "shape")))


def test_an_index_may_not_name_files_outside_the_model_folder(tiny_llama_dir, tmp_path):
    folder = tmp_path / "escape"
    shutil.copytree(tiny_llama_dir, folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"lm_head.weight": "../../etc/secret.safetensors"}}))
    with pytest.raises(ModelLoadError, match="not a safetensors file in the model folder"):
        safetensors_files(folder)
    (folder / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(ModelLoadError, match="not a valid safetensors index"):
        safetensors_files(folder)


def test_tied_and_untied_models_both_load_and_generate(tiny_model_dirs):
    for name in ("llama-mqa-tied", "llama-gqa"):
        with Engine(EngineConfig(model=tiny_model_dirs[name], dtype="float32")) as engine:
            assert len(engine.generate([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))[0].token_ids) == 3
