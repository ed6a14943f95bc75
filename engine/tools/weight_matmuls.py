"""`python -m engine.tools.weight_matmuls`: the CPU matmuls a weight level can use, timed on one model's layers.

Before writing kernels for `native-int8` / `native-int4`, the library kernels had to be measured: torch's
int8 and int4 weight-only CPU kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`, what torchao
calls on a CPU) against float32 as the engine multiplies it (its small-batch kernel up to 8 rows, the faster
of oneDNN and MKL beyond) and the engine's packed formats. Every form multiplies the same random weights in
the shapes of one decoder layer and the LM head of a bench model, for 1, 8 and 64 rows of x; the forms are
timed round-robin, and the table gives each one's median time and its ratio to float32.

    python -m engine.tools.weight_matmuls --model random-llama-20m --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from engine.model import cpu_kernels
from engine.model.matmul import linear, plan_matmul
from engine.model.packed_linear import PackedLinear
from engine.tools.bench import RANDOM_MODELS

ROWS = (1, 8, 64)


def layer_shapes(model: str) -> list[tuple[int, int]]:
    """(out, in) of a decoder layer's fused QKV, output, fused gate/up and down projections, then the LM head."""
    config = RANDOM_MODELS[model]
    hidden, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim, inter = hidden // heads, config["intermediate_size"]
    return [(hidden + 2 * kv_heads * head_dim, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter),
            (config["vocab_size"], hidden)]


def _torch_int4(weight: torch.Tensor):
    """torch's int4 weight-only form: groups of 32, a scale and a zero point each (asymmetric, as torchao packs)."""
    out_features, in_features = weight.shape
    groups = weight.view(out_features, in_features // 32, 32)
    low, high = groups.amin(dim=2), groups.amax(dim=2)
    scales = ((high - low) / 15).clamp(min=1e-8)
    values = torch.round((groups - low[..., None]) / scales[..., None]).clamp(0, 15).to(torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(values.view(out_features, in_features), 2)
    zeros = low + 8 * scales  # the kernel computes (q - 8) * scale + zero
    scales_and_zeros = torch.stack([scales, zeros], dim=2).transpose(0, 1).contiguous()
    return lambda x: torch._weight_int4pack_mm_for_cpu(x, packed, 32, scales_and_zeros)


def _torch_int8(weight: torch.Tensor):
    scales = weight.abs().amax(dim=1) / 127
    values = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return lambda x: torch._weight_int8pack_mm(x, values, scales)


def _float32(weight: torch.Tensor):
    """The engine's own float32 form for this shape (model/matmul.py: the small-batch kernel up to 8 rows, the
    faster of oneDNN and MKL beyond)."""
    plan = plan_matmul(weight.shape[0], weight.shape[1], torch.float32, "cpu", cpu_kernels.unavailable_reason() is None)
    return lambda x: linear(plan, x, weight, None)


FORMS = {"float32": _float32, "torch int8 weight-only": _torch_int8, "torch int4 weight-only (g32)": _torch_int4,
         "native-int8": lambda weight: PackedLinear(weight, 8), "native-int4": lambda weight: PackedLinear(weight, 4)}


def measure(model: str, repeats: int) -> list[dict]:
    torch.manual_seed(0)
    weights = [torch.randn(out_features, in_features) / in_features ** 0.5
               for out_features, in_features in layer_shapes(model)]
    forms = {name: [make(weight) for weight in weights] for name, make in FORMS.items()}
    rows = []
    with torch.inference_mode():
        for count in ROWS:
            inputs = [torch.randn(count, weight.shape[1]) for weight in weights]
            samples = {name: [] for name in forms}
            for _ in range(repeats + 1):  # the first round warms up and is dropped
                for name, layers in forms.items():
                    started = time.perf_counter()
                    for layer, x in zip(layers, inputs, strict=True):
                        layer(x)
                    samples[name].append(time.perf_counter() - started)
            medians = {name: statistics.median(times[1:]) for name, times in samples.items()}
            rows += [{"rows": count, "form": name, "ms": medians[name] * 1e3,
                      "x float32": medians[name] / medians["float32"]} for name in forms]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random-llama-20m", choices=sorted(RANDOM_MODELS))
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    reason = cpu_kernels.unavailable_reason()
    if reason:
        print(f"the engine's kernels are needed: {reason}", file=sys.stderr)
        return 1
    print(f"{args.model}: one decoder layer and the LM head {layer_shapes(args.model)}, "
          f"{torch.get_num_threads()} threads")
    print("| rows | form | ms | x float32 |\n| --- | --- | --- | --- |")
    for row in measure(args.model, args.repeats):
        print(f"| {row['rows']} | {row['form']} | {row['ms']:.3f} | {row['x float32']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
