"""The engine's C++ CPU kernels against plain PyTorch references (the pure-PyTorch paths compute these)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from engine.model import cpu_kernels
from engine.model.kv_format import from_cache, to_cache
from engine.model.rotary import apply_rotary
from tests.support.kernel_levels import each_kernel_level
from tests.support.paths import PROJECT_ROOT

ATOL = 2e-5


@pytest.fixture(params=["avx512", "avx2", "baseline"])
def kernel_level(request):
    """Attention and the small-batch matmul at each x86-64 level (vector width) this CPU runs; the others skip."""
    if request.param not in cpu_kernels.kernel_levels():
        pytest.skip(f"this CPU does not run the {request.param} kernels")
    previous = cpu_kernels.use_kernel_level(request.param)
    yield request.param
    cpu_kernels.use_kernel_level(previous)


def reference_attention(q, k_cache, v_cache, tables, query_start, query_len, context_lens, block_size, scale):
    """Each sequence's queries over its first context_len slots (read through its block table), causally."""
    out = torch.zeros_like(q)
    groups = q.shape[1] // k_cache.shape[0]
    for n in range(tables.shape[0]):
        count, length, first = int(query_len[n]), int(context_lens[n]), int(query_start[n])
        if count == 0:
            continue
        slots = (tables[n].long()[:, None] * block_size + torch.arange(block_size)).flatten()[:length]
        keys = k_cache[:, slots].repeat_interleave(groups, 0)
        values = v_cache[:, slots].repeat_interleave(groups, 0)
        queries = q[first:first + count].transpose(0, 1)
        scores = queries @ keys.transpose(1, 2) * scale
        limits = torch.arange(length - count, length)[:, None]
        scores = scores.masked_fill(torch.arange(length)[None, :] > limits, float("-inf"))
        out[first:first + count] = (scores.softmax(-1) @ values).transpose(0, 1)
    return out


def paged_case(heads, kv_heads, dim, block_size, query_lens, context_lens, seed=0, kv_dtype=torch.float32):
    """A pool whose unwritten slots hold NaN, random tables, and the kernel's and the reference's outputs; with
    `kv_dtype`, the pool is stored in that format (an int8 row of NaN gets a NaN scale) and the reference reads it
    dequantized. Also returns the reference over the float32 values before they were stored."""
    generator = torch.Generator().manual_seed(seed)
    num_blocks = 64
    k_cache = torch.full((kv_heads, num_blocks * block_size, dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    width = -(-max(context_lens) // block_size)
    tables = torch.stack([torch.randperm(num_blocks, generator=generator)[:width] for _ in context_lens]).int()
    for n, length in enumerate(context_lens):  # write only the slots each sequence owns up to its length
        slots = (tables[n].long()[:, None] * block_size + torch.arange(block_size)).flatten()[:length]
        k_cache[:, slots] = torch.randn(kv_heads, length, dim, generator=generator)
        v_cache[:, slots] = torch.randn(kv_heads, length, dim, generator=generator)
    query_len = torch.tensor(query_lens)
    query_start = torch.cumsum(query_len, 0) - query_len
    q = torch.randn(int(query_len.sum()), heads, dim, generator=generator)
    lens = torch.tensor(context_lens)
    scale = 1 / math.sqrt(dim)
    out = torch.full_like(q, -7.0)
    k_pool, v_pool = to_cache(k_cache, kv_dtype), to_cache(v_cache, kv_dtype)
    cpu_kernels.paged_attention(q, k_pool, v_pool, tables, query_start, query_len, lens, block_size, scale, out)
    expected = reference_attention(q, from_cache(k_pool, torch.float32), from_cache(v_pool, torch.float32), tables,
                                   query_start, query_len, lens, block_size, scale)
    exact = reference_attention(q, k_cache, v_cache, tables, query_start, query_len, lens, block_size, scale)
    return out, expected, exact


@pytest.mark.parametrize("heads,kv_heads,dim", [(8, 4, 64), (8, 8, 32), (4, 1, 128), (6, 2, 24)])
@pytest.mark.parametrize("block_size", [1, 4, 16, 32])
def test_paged_attention_matches_reference_and_never_reads_unwritten_slots(heads, kv_heads, dim, block_size,
                                                                          kernel_level):
    """Decode rows and multi-token chunks over a cached prefix (as speculative verification and chunked prefill
    tails send them, up to 32 tokens); every slot no sequence wrote is NaN, so any read past a causal limit
    would show."""
    out, expected, _ = paged_case(heads, kv_heads, dim, block_size, query_lens=[1, 3, 1, 5, 32],
                               context_lens=[1, 40, 17, 61, 33])
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=1e-4)


# How far attention over a pool of each format may be from attention over the float32 values it stored.
STORED_TOLERANCE = {torch.bfloat16: 2e-2, torch.int8: 5e-2}
# How far the int8 pool's integer path (head_dim a multiple of 32) may be from attention over the dequantized pool:
# it rounds each query row and each chunk's weights to 16 bits (a few parts in 10^5), where the pool's own 8-bit
# rounding moves the output by up to STORED_TOLERANCE.
INTEGER_PATH_TOLERANCE = 2e-4


# Keys in one chunk of the integer path (kChunkKeys, csrc/kernels.h): a chunk may span blocks.
CHUNK_KEYS = 32


@pytest.mark.parametrize("dim", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("count", [1, 3, 4, 7, 16, 17, 31, CHUNK_KEYS])
@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_int8_pool_chunk_sums_are_exact_integers_at_every_level(dim, count, rows):
    """The integer path of int8 attention (csrc/int8_kv.cpp): a chunk's scores (int16 queries times int8 keys) and
    its weighted sums of values (int16 weights times int8 values) equal torch's integer matmuls exactly, at every
    level (VNNI, AVX2, plain), for odd key counts (the last pair's partner weighs 0) and the extreme values; for a
    few query rows (VNNI keeps keys and sums in registers) and for more (through a widened scratch)."""
    generator = torch.Generator().manual_seed(dim + count + rows)
    keys = torch.randint(-128, 128, (count, dim + 4), dtype=torch.int8, generator=generator)
    values = torch.randint(-128, 128, (count, dim + 4), dtype=torch.int8, generator=generator)
    keys[0, :dim], values[0, :dim] = -128, -128  # the largest products the bounds allow
    queries = torch.randint(-32767, 32768, (rows, dim), dtype=torch.int16, generator=generator)
    queries[0] = -32767
    weights = torch.zeros(rows, CHUNK_KEYS, dtype=torch.int16)
    weights[:, :count] = torch.randint(0, 32768, (rows, count), dtype=torch.int16, generator=generator)
    weights[0, :count] = 32767
    expected_scores = queries.long() @ keys[:, :dim].long().T
    expected_sums = weights[:, :count].long() @ values[:, :dim].long()
    paths = set()
    for level in each_kernel_level():
        paths.add(torch.ops.playground_cpu.int8_kv_path(level))
        scores, sums = torch.ops.playground_cpu.int8_kv_chunk_sums(keys, values, queries, weights, level)
        assert torch.equal(scores.long(), expected_scores), level
        assert torch.equal(sums.long(), expected_sums), level
    assert {"plain"} | ({"avx2"} & set(cpu_kernels.kernel_levels())) <= paths


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,dim", [(8, 4, 64), (4, 1, 128), (6, 2, 24)])
@pytest.mark.parametrize("block_size", [1, 4, 16, 32])
def test_paged_attention_reads_int8_and_bfloat16_pools_in_place(kv_dtype, heads, kv_heads, dim, block_size,
                                                                kernel_level):
    """Over a pool stored as int8 rows with their scale (or bfloat16), the kernel equals attention on the
    dequantized pool (tight: only the order of float sums differs) and stays near attention on the float32 values
    (loose: the format's rounding); unwritten rows are NaN (int8: a NaN scale) and must never be read."""
    out, expected, exact = paged_case(heads, kv_heads, dim, block_size, query_lens=[1, 3, 1, 5, 32],
                                      context_lens=[1, 40, 17, 61, 33], kv_dtype=kv_dtype)
    assert torch.isfinite(out).all()
    integer_path = kv_dtype == torch.int8 and dim % 32 == 0
    torch.testing.assert_close(out, expected, atol=INTEGER_PATH_TOLERANCE if integer_path else ATOL, rtol=1e-4)
    torch.testing.assert_close(out, exact, atol=STORED_TOLERANCE[kv_dtype], rtol=0)
    assert not torch.equal(expected, exact)  # the format really rounds


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.bfloat16])
@pytest.mark.parametrize("dim", [64, 24])
def test_store_kv_writes_the_pools_format_bit_for_bit(kv_dtype, dim, kernel_level):
    """The kernel's KV store and the torch paths' (model/kv_format.py) write the same bytes: int8 values rounded to
    nearest even from x / scale with their float32 scale max|x| / 127 after them (a zero row: scale 0), bfloat16
    rounded to nearest even; a row read back is within half a step of what was stored."""
    generator = torch.Generator().manual_seed(dim)
    k = torch.randn(6, 2, dim, generator=generator) * torch.tensor([1e-3, 1.0, 30.0, 1.0, 1.0, 1.0])[:, None, None]
    k[3] = 0.0
    k[4, 0, :4] = torch.tensor([0.5, 1.5, -2.5, 127.0])  # ties that round to even at a scale of 1
    v = torch.randn(6, 2, dim, generator=generator)
    width = dim + 4 if kv_dtype == torch.int8 else dim
    k_cache, v_cache = torch.zeros(2, 20, width, dtype=kv_dtype), torch.zeros(2, 20, width, dtype=kv_dtype)
    slots = torch.tensor([3, 17, 18, 19, 0, 7])
    cpu_kernels.store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache[:, slots], to_cache(k, kv_dtype).transpose(0, 1))
    assert torch.equal(v_cache[:, slots], to_cache(v, kv_dtype).transpose(0, 1))
    read = from_cache(k_cache[:, slots], torch.float32).transpose(0, 1)
    if kv_dtype == torch.int8:
        scales = k_cache[:, slots, dim:].contiguous().view(torch.float32).transpose(0, 1)
        assert torch.equal(scales, k.abs().amax(-1, keepdim=True) / 127)
        assert (read - k).abs().le(scales / 2 * (1 + 1e-5)).all()
        assert k_cache[0, slots[4], :4].tolist() == [0, 2, -2, 127]
        assert (k_cache[:, slots[3]] == 0).all()
    else:
        assert torch.equal(read, k.to(torch.bfloat16).float())


def test_the_kernels_refuse_a_pool_of_another_format():
    q, k = torch.zeros(1, 1, 16), torch.zeros(1, 1, 16)
    tables, one = torch.tensor([[0]], dtype=torch.int32), torch.tensor([1])
    for pool, message in ((torch.zeros(1, 16, 16, dtype=torch.int8), "holds 20 elements"),
                          (torch.zeros(1, 16, 16, dtype=torch.float16), "float32, bfloat16 or int8")):
        with pytest.raises(RuntimeError, match=message):
            cpu_kernels.paged_attention(q, pool, pool.clone(), tables, torch.tensor([0]), one, one, 16, 1.0,
                                        torch.zeros(1, 1, 16))
        with pytest.raises(RuntimeError, match=message):
            cpu_kernels.store_kv(k, k, pool, pool.clone(), torch.tensor([0]))


def test_paged_attention_leaves_rows_of_other_sequences_alone_and_reads_strided_queries():
    """A sequence with no kernel rows (query_len 0: attended elsewhere) keeps its rows of `out`; q may be a
    view of a fused QKV output (rows further apart than heads * dim)."""
    generator = torch.Generator().manual_seed(3)
    kv_heads, heads, dim, block_size = 2, 4, 32, 8
    k_cache = torch.randn(kv_heads, 16 * block_size, dim, generator=generator)
    v_cache = torch.randn_like(k_cache)
    qkv = torch.randn(4, (heads + 2 * kv_heads) * dim, generator=generator)
    q = qkv[:, :heads * dim].view(4, heads, dim)
    tables = torch.tensor([[3, 5], [7, 1]], dtype=torch.int32)
    query_start, query_len, lens = torch.tensor([0, 2]), torch.tensor([2, 0]), torch.tensor([12, 10])
    out = torch.full((4, heads, dim), -7.0)
    cpu_kernels.paged_attention(q, k_cache, v_cache, tables, query_start, query_len, lens, block_size, 0.3, out)
    expected = reference_attention(q.contiguous(), k_cache, v_cache, tables, query_start, query_len, lens,
                                   block_size, 0.3)
    torch.testing.assert_close(out[:2], expected[:2], atol=ATOL, rtol=1e-4)
    assert (out[2:] == -7.0).all()


def test_paged_attention_refuses_block_ids_outside_the_pool():
    k_cache = torch.zeros(1, 32, 16)
    with pytest.raises(RuntimeError, match="block id out of range"):
        cpu_kernels.paged_attention(torch.zeros(1, 1, 16), k_cache, k_cache.clone(),
                                    torch.tensor([[9]], dtype=torch.int32), torch.tensor([0]), torch.tensor([1]),
                                    torch.tensor([1]), 16, 1.0, torch.zeros(1, 1, 16))


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 11])
@pytest.mark.parametrize("in_features,out_features", [(512, 1024), (33, 7), (64, 130)])
def test_small_batch_linear_matches_f_linear(rows, in_features, out_features, kernel_level):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator)
    torch.testing.assert_close(cpu_kernels.small_batch_linear(x, weight, bias), F.linear(x, weight, bias),
                               atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(cpu_kernels.small_batch_linear(x, weight, None), x @ weight.T, atol=1e-4, rtol=1e-4)


def test_the_best_level_runs_by_default_and_each_level_runs_its_own_code():
    """The best level is the default; another level really computes differently (its sums are taken in another
    order, so the last bits differ), which a level switch that changed nothing would not show."""
    levels = cpu_kernels.kernel_levels()
    assert levels[-1] == "baseline"
    generator = torch.Generator().manual_seed(11)
    x, weight = torch.randn(3, 1024, generator=generator), torch.randn(64, 1024, generator=generator)
    best = cpu_kernels.small_batch_linear(x, weight, None)
    assert cpu_kernels.use_kernel_level("baseline") == levels[0]
    try:
        baseline = cpu_kernels.small_batch_linear(x, weight, None)
    finally:
        cpu_kernels.use_kernel_level(levels[0])
    torch.testing.assert_close(baseline, best, atol=1e-4, rtol=1e-4)
    if len(levels) > 1:
        assert not torch.equal(baseline, best)
    with pytest.raises(RuntimeError, match="does not run kernel level"):
        cpu_kernels.use_kernel_level("avx1024")


@pytest.mark.parametrize("level", ["baseline", "avx1024"])
def test_the_kernel_level_can_be_set_for_a_whole_process(level):
    """PLAYGROUND_KERNEL_LEVEL runs every kernel at a lower level (to measure an AVX2-only CPU's figures on a better
    one); a level this CPU does not run is refused with the ones it does."""
    code = ("from engine.model import cpu_kernels; import torch; print(cpu_kernels.unavailable_reason()); "
            "print(torch.ops.playground_cpu.packed_kernel_name())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT,
                            env={**os.environ, cpu_kernels.KERNEL_LEVEL_ENV: level}, timeout=120)
    if level == "baseline":
        assert result.stdout.split() == ["None", "plain"], result.stderr
    else:
        assert result.returncode != 0 and "PLAYGROUND_KERNEL_LEVEL='avx1024': this CPU runs" in result.stderr


def torch_rms_norm(x, weight, eps):
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x


def test_norms_activation_rotary_and_kv_store_match_pytorch():
    generator = torch.Generator().manual_seed(5)
    x, residual = torch.randn(5, 96, generator=generator), torch.randn(5, 96, generator=generator)
    weight = torch.randn(96, generator=generator)
    torch.testing.assert_close(cpu_kernels.rms_norm(x, weight, 1e-6), torch_rms_norm(x, weight, 1e-6))
    normed, total = cpu_kernels.add_rms_norm(x, residual, weight, 1e-6)
    torch.testing.assert_close(total, x + residual)
    torch.testing.assert_close(normed, torch_rms_norm(x + residual, weight, 1e-6))

    gate_up = torch.randn(5, 2 * 40, generator=generator) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_kernels.silu_mul(gate_up), F.silu(gate) * up)

    qkv = torch.randn(5, (4 + 2 * 2) * 16, generator=generator)
    q, k, v = qkv.split([64, 32, 32], dim=-1)
    q, k, v = q.view(5, 4, 16), k.view(5, 2, 16), v.view(5, 2, 16)
    angles = torch.randn(5, 8, generator=generator)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    expected_q, expected_k = apply_rotary(q, cos[:, None], sin[:, None]), apply_rotary(k, cos[:, None], sin[:, None])
    cpu_kernels.rotary_(q, k, cos, sin)
    torch.testing.assert_close(q, expected_q)
    torch.testing.assert_close(k, expected_k)

    k_cache, v_cache = torch.zeros(2, 40, 16), torch.zeros(2, 40, 16)
    slots = torch.tensor([3, 17, 18, 39, 0])
    cpu_kernels.store_kv(k, v, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache[:, slots], k.transpose(0, 1))
    torch.testing.assert_close(v_cache[:, slots], v.transpose(0, 1))
    assert k_cache.abs().sum(-1).count_nonzero() == 2 * len(slots)


def test_kernels_refuse_other_dtypes():
    with pytest.raises(RuntimeError, match="float32"):
        cpu_kernels.small_batch_linear(torch.zeros(2, 8, dtype=torch.bfloat16), torch.zeros(4, 8), None)


def test_the_kernels_spread_work_over_torchs_threads():
    """Built without OpenMP, at::parallel_for runs on the calling thread alone: attention at batch 64 took as long on
    two threads as on one. With two threads asked for, two must do the work."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert cpu_kernels.parallel_threads_used(8) == 2
        torch.set_num_threads(1)
        assert cpu_kernels.parallel_threads_used(8) == 1
    finally:
        torch.set_num_threads(previous)
