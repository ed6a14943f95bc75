"""Sharded layers without worker processes: two gloo ranks on two threads of this process.

Each rank builds its shard of a tiny checkpoint (its slice of every linear layer, its KV heads)
through the same builder the workers use, and executes the same plan; the logits must equal the
unsharded model's. Covers GQA (KV heads split), MHA, and MQA (one KV head replicated on both
ranks), plus Qwen2's QKV bias (added by the column shards) and the row-parallel bias rule; GQA
conversion before the split, and quantization of each rank's own slice.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from transformers import AutoConfig

from engine.model.gqa import convert_spec
from engine.model.linear import BuildContext, RowParallelLinear
from engine.model.parallel import ParallelContext
from engine.model.spec import ModelSpec
from engine.quant.storage import planned_weight_bytes, weight_storage_bytes
from engine.runner.build import RunnerSettings, build_runner, meta_model, rank_kv_spec
from engine.runner.step_plan import SequenceChunk, StepPlan

RANKS = 2
BLOCK = 4
BUILD_ONE_AT_A_TIME = threading.Lock()


def settings_for(folder: str, quantization: str = "none", gqa: str | int = "native") -> RunnerSettings:
    hf_config = AutoConfig.from_pretrained(folder)
    checkpoint = ModelSpec.from_hf_config(hf_config)
    return RunnerSettings(folder, hf_config, convert_spec(checkpoint, gqa), quantization, torch.float32, torch.float32,
                          "cpu", "sdpa", BLOCK, 64, 128, False, 8)


def on_ranks(work, size: int = RANKS) -> list:
    """Run `work(parallel)` on `size` threads, one gloo rank each; the results in rank order."""
    store = dist.HashStore()
    results: list = [None] * size
    errors: list = []

    def run(rank: int) -> None:
        try:
            group = dist.ProcessGroupGloo(store, rank, size, timedelta(seconds=30))
            results[rank] = work(ParallelContext(rank, size, group))
        except Exception as error:  # surfaced below: a thread's failure must fail the test
            errors.append(error)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return results


PLANS = [
    # a fresh prompt, then a chunk continuing another prompt, then decode rows reading the cache
    StepPlan([SequenceChunk([5, 9, 11, 3, 17, 42, 8], 0, [0, 1], 1), SequenceChunk([7, 7, 30], 0, [2], 0)]),
    StepPlan([SequenceChunk([99], 7, [0, 1], 1), SequenceChunk([12, 13, 14, 15], 3, [2, 3], 2)]),
    StepPlan([SequenceChunk([4], 8, [0, 1, 4], 1), SequenceChunk([6], 7, [2, 3], 1)]),
]


def run_plans(settings: RunnerSettings, parallel: ParallelContext | None = None) -> list[torch.Tensor]:
    runner = build_runner(settings, parallel) if parallel else build_runner(settings)
    return [runner.execute(plan) for plan in PLANS]


@pytest.mark.parametrize("arch", ["llama-gqa", "llama3-rope-scaling", "llama-mqa-tied", "qwen2-qkv-bias"])
def test_sharded_logits_equal_unsharded(arch, tiny_model_dirs):
    settings = settings_for(tiny_model_dirs[arch])
    whole = run_plans(settings)
    per_rank = on_ranks(lambda parallel: run_plans(settings, parallel))
    for rank_logits in per_rank:
        for got, expected in zip(rank_logits, whole, strict=True):
            assert got.shape == expected.shape
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gqa", ["mha", 1])
def test_gqa_conversion_happens_before_the_split(gqa, tiny_model_dirs):
    """Converted K/V heads (repeated to 4, or pooled to 1 and then replicated) are sliced like native ones."""
    settings = settings_for(tiny_model_dirs["llama-gqa"], gqa=gqa)
    whole = run_plans(settings)
    for rank_logits in on_ranks(lambda parallel: run_plans(settings, parallel)):
        for got, expected in zip(rank_logits, whole, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama-gqa", "llama-mqa-tied"])
def test_each_rank_holds_its_share(arch, tiny_model_dirs):
    """Weights split (except norms and a replicated KV head's projections); each KV pool holds the rank's
    KV heads (a copy of MQA's one head)."""
    settings = settings_for(tiny_model_dirs[arch])
    spec = settings.spec
    whole = build_runner(settings)

    def shard_sizes(parallel):
        runner = build_runner(settings, parallel)
        return weight_storage_bytes(runner.model), runner.kv_cache.nbytes, planned_weight_bytes(
            meta_model(spec, torch.float32, "none", "cpu", parallel))

    sizes = on_ranks(shard_sizes)
    replicated = (2 * spec.num_layers + 1) * spec.hidden_size * 4  # the norms
    if spec.num_kv_heads < RANKS:  # and K/V projections of a KV head every rank keeps
        replicated += spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * spec.hidden_size * 4
    for weights, kv_bytes, estimated in sizes:
        assert weights == estimated
        assert weights == (weight_storage_bytes(whole.model) - replicated) // RANKS + replicated
        local_kv_heads = max(1, spec.num_kv_heads // RANKS)
        assert kv_bytes == whole.kv_cache.nbytes * local_kv_heads // spec.num_kv_heads
    assert rank_kv_spec(spec, RANKS).num_kv_heads == max(1, spec.num_kv_heads // RANKS)


def test_row_parallel_bias_is_added_once():
    """Each rank multiplies its input slice; only rank 0 adds the bias, so the all-reduce counts it once."""
    torch.manual_seed(0)
    weight, bias, x = torch.randn(3, 4), torch.randn(3), torch.randn(2, 4)

    def forward(parallel):
        layer = RowParallelLinear(4, 3, True, BuildContext(torch.float32, "cpu", parallel), "o_proj")
        layer.weight_loader(layer.weight, weight)
        layer.weight_loader(layer.bias, bias)
        return layer(x[:, parallel.rank * 2:(parallel.rank + 1) * 2])

    for out in on_ranks(forward):
        torch.testing.assert_close(out, x @ weight.T + bias)


def test_collectives_are_timed():
    def reduce(parallel):
        parallel.all_reduce(torch.ones(8))
        parallel.all_gather_last_dim(torch.ones(2, 3))
        return parallel.timer.calls, parallel.timer.seconds

    for calls, seconds in on_ranks(reduce):
        assert calls == 2 and seconds > 0


def test_kv_heads_fewer_than_ranks_are_replicated_evenly():
    spec = ModelSpec("LlamaForCausalLM", 10, 8, 1, 4, 1, 2, 8, 1e-6, False, False, False, False, 16, None)
    assert rank_kv_spec(spec, 4).num_kv_heads == 1
    with pytest.raises(ValueError, match="cannot share 2 KV heads"):
        rank_kv_spec(spec.replace(num_kv_heads=2, num_heads=6), 3)


def test_each_rank_quantizes_its_own_shard(tiny_model_dirs):
    """Each rank packs only its slice: its bytes are what the estimate plans for its shard, below the unquantized
    shard's. Row-parallel layers quantize their input slice with its own scales, so the result is not N=1's
    bit for bit; it stays closer to N=1's quantized logits than quantizing moves them from float32."""
    settings = settings_for(tiny_model_dirs["llama-gqa"], "quanto-int8")
    spec = settings.spec
    whole = run_plans(settings)
    unquantized = run_plans(settings_for(tiny_model_dirs["llama-gqa"]))

    def shard(parallel):
        # One rank quantizes at a time: quanto building its tensors in two threads at once once raised CPython
        # 3.11's "AST constructor recursion depth mismatch" (a compile() race between threads, not an engine
        # fault; the real ranks are processes). Building uses no collectives, so the ranks cannot deadlock here.
        with BUILD_ONE_AT_A_TIME:
            runner = build_runner(settings, parallel)
        return ([runner.execute(plan) for plan in PLANS], weight_storage_bytes(runner.model),
                planned_weight_bytes(meta_model(spec, torch.float32, "quanto-int8", "cpu", parallel)),
                planned_weight_bytes(meta_model(spec, torch.float32, "none", "cpu", parallel)))

    quantizing_error = max((a - b).abs().max().item() for a, b in zip(whole, unquantized, strict=True))
    for logits, weights, planned, full_precision in on_ranks(shard):
        assert weights == planned < full_precision
        sharding_error = max((a - b).abs().max().item() for a, b in zip(logits, whole, strict=True))
        assert sharding_error < quantizing_error
