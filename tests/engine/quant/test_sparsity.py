"""2:4 sparsity (`quantization="sparse-2:4"`): the pruning, its quality cost, its honest bytes and notes, its refusals.

On a CPU the pruned weights stay dense (float32's bytes and path); the semi-structured GPU path is tested at the
end (marked `gpu`, skipped without CUDA).
"""

from __future__ import annotations

import pytest
import torch

from engine import ConfigError, Engine, EngineConfig, SamplingParams, choice_note, estimate_memory, plan_engine
from engine.model.linear import BuildContext, LinearBase, RowParallelLinear
from engine.quant import sparsity
from engine.quant.sparsity import SparseLinearMethod, prune_2_4
from engine.testing import EngineProbe

DEMO = dict(model="demo", dtype="float32", kv_cache_bytes=2**24)
# Two questions the demo target recalls word for word (pruned, it still does) and one it was never taught.
PROMPTS = [[{"role": "user", "content": q}]
           for q in ("What does the json module do?", "How do I use `re.sub`?", "Write a haiku about autumn.")]


def test_pruning_keeps_the_two_largest_of_every_four_inputs():
    torch.manual_seed(0)
    weight = torch.randn(64, 128)
    groups = prune_2_4(weight).reshape(64, 32, 4)
    original = weight.reshape(64, 32, 4)
    kept = groups != 0
    assert (kept.sum(-1) == 2).all()
    assert torch.equal(groups[kept], original[kept])  # kept values untouched
    smallest_kept = original.abs().masked_fill(~kept, float("inf")).amin(-1)
    largest_dropped = original.abs().masked_fill(kept, -1.0).amax(-1)
    assert (smallest_kept > largest_dropped).all()


def test_inputs_that_are_not_whole_groups_of_four_are_refused():
    build = BuildContext(torch.float32, "cpu", linear_method=lambda prefix: SparseLinearMethod("cpu"))
    with pytest.raises(ConfigError, match="sparse-2:4.*odd.*multiples of 4.*6"):
        RowParallelLinear(6, 8, False, build, "odd")


@pytest.fixture(scope="module")
def demo_runs() -> dict:
    """Greedy answers, perplexity and weights of the demo target unpruned and 2:4-pruned (float32, CPU)."""
    runs = {}
    for level in ("none", "sparse-2:4"):
        config = EngineConfig(**DEMO, quantization=level)
        with Engine(config) as engine:
            weights = [m.weight.detach().clone() for m in EngineProbe(engine).model().modules()
                       if isinstance(m, LinearBase)]
            runs[level] = {"answers": [o.token_ids for o in engine.generate(
                PROMPTS, SamplingParams(max_tokens=16, ignore_eos=True))], "perplexity": engine.perplexity().perplexity,
                "weights": weights, "bytes": engine.stats().weights_bytes, "estimate": estimate_memory(config),
                "notices": engine.info.notices}
    return runs


def test_the_engine_serves_every_linear_weight_pruned_2_4(demo_runs):
    pruned, full = demo_runs["sparse-2:4"]["weights"], demo_runs["none"]["weights"]
    assert len(pruned) == len(full) == 8 * 4  # QKV, O, gate/up, down of each layer
    for got, original in zip(pruned, full, strict=True):
        assert torch.equal(got, prune_2_4(original))


def test_pruning_changes_the_output_and_costs_perplexity(demo_runs):
    """The demo target measured 98.4 unpruned and 123.0 pruned (float32, CPU); its recalled answers survive the
    pruning, the untaught question's does not."""
    assert demo_runs["sparse-2:4"]["answers"] != demo_runs["none"]["answers"]
    assert all(len(answer) == 16 for answer in demo_runs["sparse-2:4"]["answers"])
    assert demo_runs["sparse-2:4"]["perplexity"] > demo_runs["none"]["perplexity"] * 1.05


def test_on_a_cpu_the_bytes_are_float32s_and_the_notes_say_so(demo_runs):
    sparse = demo_runs["sparse-2:4"]
    assert sparse["bytes"] == sparse["estimate"].weights_bytes == demo_runs["none"]["bytes"]
    assert any("dense (no sparse kernel on a CPU)" in notice for notice in sparse["notices"])
    assert "no speedup on CPU" in choice_note("quantization", "sparse-2:4", "cpu")


def test_gpu_bytes_and_notice_follow_what_the_sparse_kernels_take(monkeypatch):
    """9/16 of the dense bytes where the layer goes semi-structured; dense bytes, named in the notice, where not."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    dense = 256 * 704 * 2
    assert sparsity.storage_bytes(256, 704, torch.bfloat16, "cuda") == dense * 9 // 16
    assert sparsity.storage_bytes(256, 700, torch.bfloat16, "cuda") == 256 * 700 * 2  # 700 inputs: not 64s
    assert sparsity.storage_bytes(256, 704, torch.float32, "cuda") == dense * 2
    layers = [("down_proj", 256, 700), ("qkv_proj", 768, 256)]
    notice = sparsity.plan_notice(layers, torch.bfloat16, "cuda")
    assert "down_proj" in notice and "qkv_proj" not in notice and "700" in notice
    assert sparsity.plan_notice(layers[1:], torch.bfloat16, "cuda") is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert "every pruned weight dense" in sparsity.plan_notice(layers, torch.bfloat16, "cuda")


def test_the_hf_baseline_is_refused_with_one_clear_error():
    with pytest.raises(ConfigError, match="sparse-2:4.*native engine only.*transformers cannot load"):
        plan_engine(EngineConfig(model="demo", backend="hf", quantization="sparse-2:4"))
    assert plan_engine(EngineConfig(**DEMO, quantization="sparse-2:4")).backend == "native"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_weights_go_semi_structured_and_multiply_like_the_dense_pruned_ones():
    """The demo target in bfloat16: every layer compressed (its widths are multiples of 32 and 64), bytes as
    estimated, and each layer's output the dense pruned product to bfloat16 rounding."""
    from torch.sparse import SparseSemiStructuredTensor

    if torch.cuda.get_device_capability() < sparsity.MIN_CAPABILITY:
        pytest.skip("the GPU has no sparse tensor cores")
    config = EngineConfig(model="demo", device="cuda", dtype="bfloat16", quantization="sparse-2:4",
                          kv_cache_bytes=2**24)
    with Engine(config.replace(quantization="none")) as engine:
        dense = next(m for m in EngineProbe(engine).model().modules() if isinstance(m, LinearBase)).weight.clone()
    with Engine(config) as engine:
        layers = [m for m in EngineProbe(engine).model().modules() if isinstance(m, LinearBase)]
        assert all(isinstance(layer.weight, SparseSemiStructuredTensor) for layer in layers)
        assert engine.stats().weights_bytes == estimate_memory(config).weights_bytes
        x = torch.randn(5, layers[0].input_size, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(layers[0](x), x @ prune_2_4(dense).t(), rtol=2e-2, atol=2e-2)
        outputs = engine.generate(PROMPTS, SamplingParams(max_tokens=8, ignore_eos=True))
    assert all(len(o.token_ids) == 8 for o in outputs)
