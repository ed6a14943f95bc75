"""The engine's own 8-bit and 4-bit formats (`native-int8`, `native-int4`): packing, the integer kernels at every
kernel level, the bytes, the quality on the demo model, the speed direction, and the refusals.

The kernels quantize each row of x to int8 on the fly and sum in integers, so they are compared with the product
of the same quantized activations and the unpacked weight; the 8-bit results are bitwise equal at every kernel
level and whatever the number of rows sharing a call (so a prefill's perplexity measures what a decode step
computes), the 4-bit ones up to float rounding of the per-group sums.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from engine import ConfigError, Engine, EngineConfig, choice_note, estimate_memory
from engine.model import cpu_kernels
from engine.model.packed_linear import PackedLinear, pack_int4, pack_int8, packed_bytes, unpack
from engine.testing import EngineProbe
from tests.support.kernel_levels import each_kernel_level
from tests.support.tiny_models import COMMON

SHAPES = [(1536, 512), (512, 1376), (70, 100), (33, 64)]  # (out, in): fused QKV, down projection, ragged tails


def quantized_rows(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels see it: int8 per row (round half away from zero), times the row's scale."""
    scale = x.abs().amax(dim=1, keepdim=True) / 127
    ratio = x / torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.trunc(ratio + 0.5 * torch.sign(ratio)) * scale


def every_level(linear: PackedLinear, x: torch.Tensor) -> dict[str, torch.Tensor]:
    return {torch.ops.playground_cpu.packed_kernel_name(): linear(x) for _ in each_kernel_level()}


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_every_kernel_level_computes_the_quantized_product(bits, out_features, in_features):
    torch.manual_seed(out_features + in_features + bits)
    weight = torch.randn(out_features, in_features)
    linear = PackedLinear(weight, bits)
    bias = torch.randn(out_features)
    for rows in (1, 3, 8, 13):
        x = torch.randn(rows, in_features)
        expected = quantized_rows(x) @ unpack(linear.packed, linear.scales, in_features).T
        for name, got in every_level(linear, x).items():
            assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * expected.abs().max()), (name, rows)
        with_bias = linear(x, bias)
        assert torch.allclose(with_bias, linear(x) + bias, atol=1e-5)


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_eight_bit_results_are_the_same_at_every_level_and_for_any_number_of_rows(out_features, in_features):
    torch.manual_seed(1)
    linear = PackedLinear(torch.randn(out_features, in_features), 8)
    x = torch.randn(13, in_features)
    results = list(every_level(linear, x).values())
    assert all(torch.equal(result, results[0]) for result in results)
    assert torch.equal(torch.cat([linear(x[i:i + 1]) for i in range(13)]), results[0])


def test_packing_keeps_each_weight_within_half_a_step_of_its_scale_or_a_clamped_step():
    torch.manual_seed(2)
    weight = torch.randn(40, 200) * torch.linspace(0.1, 3, 200)
    values, scales = pack_int8(weight)
    assert values.shape == (40, 256) and values.dtype == torch.int8 and scales.shape == (40,)
    assert torch.all((unpack(values, scales, 200) - weight).abs() <= scales[:, None] / 2 + 1e-6)
    nibbles, group_scales = pack_int4(weight)
    assert nibbles.shape == (40, 128) and nibbles.dtype == torch.uint8 and group_scales.shape == (40, 8)  # 256 inputs
    error = (unpack(nibbles, group_scales, 200) - weight).abs().view(40, -1)
    steps = group_scales.abs().repeat_interleave(32, dim=1)[:, :200]
    assert torch.all(error <= steps + 1e-6)  # 7 is the largest nibble: the value opposite the extreme may clamp
    assert (error > steps / 2 + 1e-6).float().mean() < 0.02


def test_four_bit_layout_puts_input_j_low_and_input_j_plus_64_high_with_the_extreme_at_minus_8():
    weight = torch.zeros(1, 128)
    weight[0, 3] = -4.0   # the largest magnitude of group 0: scale 0.5, stored as nibble 0 (q = -8)
    weight[0, 67] = 2.0   # input 3 + 64, alone in group 2: scale -0.25, q = -8 as well
    weight[0, 5] = 1.0    # q = 2 -> nibble 10
    nibbles, scales = pack_int4(weight)
    assert scales.tolist() == [[0.5, 0.0, -0.25, 0.0]]
    assert nibbles.shape == (1, 64)
    assert nibbles[0, 3].item() == 0 | (0 << 4)
    assert nibbles[0, 5].item() == 10 | (8 << 4)
    assert nibbles[0, 0].item() == 8 | (8 << 4)


def test_packed_bytes_are_a_quarter_and_under_a_sixth_of_float32():
    assert packed_bytes(4096, 4096, 8) / (4096 * 4096 * 4) == pytest.approx(0.25, abs=0.001)
    assert packed_bytes(4096, 4096, 4) / (4096 * 4096 * 4) < 1 / 6


def test_one_row_reads_packed_weights_faster_than_float32():
    """The point of the formats: a decode step reads every weight, so fewer bytes are a faster step. A weight beyond
    the cache (64 MB in float32): one row through the 8-bit kernel at most 0.6x the float32 kernel's time, 4-bit
    at most 0.6x too (typically 0.3x and 0.25x here)."""
    torch.manual_seed(3)
    weight = torch.randn(4096, 4096)
    x = torch.randn(1, 4096)
    packed = {bits: PackedLinear(weight, bits) for bits in (8, 4)}

    def median_seconds(run) -> float:
        run()
        samples = []
        for _ in range(15):
            started = time.perf_counter()
            run()
            samples.append(time.perf_counter() - started)
        return statistics.median(samples)

    with torch.inference_mode():
        full = median_seconds(lambda: cpu_kernels.small_batch_linear(x, weight, None))
        for bits, linear in packed.items():
            assert median_seconds(lambda linear=linear: linear(x)) <= 0.6 * full, bits


@pytest.fixture(scope="module")
def demo_perplexity() -> dict[str, float]:
    values = {}
    for level in ("none", "native-int8", "native-int4"):
        with Engine(EngineConfig(model="demo", quantization=level, kv_cache_bytes=2**24)) as engine:
            values[level] = engine.perplexity().perplexity
    return values


def test_demo_perplexity_stays_within_the_bars(demo_perplexity):
    """8-bit weights (and activations) within 0.5% of float32's held-out perplexity, 4-bit within 5%."""
    full = demo_perplexity["none"]
    assert abs(demo_perplexity["native-int8"] / full - 1) <= 0.005
    assert abs(demo_perplexity["native-int4"] / full - 1) <= 0.05


def test_the_levels_pack_the_decoder_and_the_lm_head_and_say_so(tiny_llama_dir):
    """Untied LM head: packed too, its float weight freed; the estimate before loading equals what is held."""
    base = dict(model=tiny_llama_dir, kv_cache_bytes=2**20)
    full = estimate_memory(EngineConfig(**base)).weights_bytes
    for level, share in (("native-int8", 0.3), ("native-int4", 0.45)):  # 4-bit pads the tiny 64 inputs to 128
        config = EngineConfig(**base, quantization=level)
        with Engine(config) as engine:
            held = engine.stats().weights_bytes
            head = EngineProbe(engine).model().lm_head
            assert head.weight.numel() == 0 and head.packed.bits == 8
        assert held == estimate_memory(config).weights_bytes
        embedding = COMMON["vocab_size"] * COMMON["hidden_size"] * 4  # float32 embedding, kept for lookups
        assert (held - embedding) <= share * (full - embedding), level


def test_the_engine_formats_are_refused_where_they_cannot_run(tiny_llama_dir):
    with pytest.raises(ConfigError, match="native-int8.*transformers cannot load"):
        Engine(EngineConfig(model=tiny_llama_dir, backend="hf", quantization="native-int8"))
    with pytest.raises(ConfigError, match="native-int4.*CPU kernels"):
        Engine(EngineConfig(model=tiny_llama_dir, quantization="native-int4", cpu_kernels=False))
    with pytest.raises(ConfigError, match="native-int8.*float32"):
        Engine(EngineConfig(model=tiny_llama_dir, quantization="native-int8", dtype="bfloat16"))


def test_each_level_says_which_tensors_it_packs():
    for level in ("native-int8", "native-int4"):
        assert "packs the decoder's linear layers and the LM head (int8)" in choice_note("quantization", level, "cpu")
    assert "the LM head and the embeddings stay in the model dtype" in choice_note("quantization", "nf4", "cpu")
