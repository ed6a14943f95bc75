"""Target/draft pairs for the speculative decoding tests, built locally with random weights, and the
statistical test their sampled outputs are checked with.

A target whose later layers only nudge the residual stream, and a draft made of its embeddings, first
layer and head, agree often but not always, so greedy tests see full, partial and zero acceptance;
an independent random draft disagrees more, which exercises the residual draws of the sampled tests.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build_llama(folder: Path, vocab_size: int, hidden_size: int = 64, layers: int = 2, seed: int = 0,
                init_std: float = 0.2, later_layer_scale: float = 1.0) -> str:
    """A random Llama; `later_layer_scale` shrinks the output projections of every layer but the first."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, initializer_range=init_std, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(later_layer_scale)
            layer.mlp.down_proj.weight.mul_(later_layer_scale)
    model.save_pretrained(folder)
    return str(folder)


def build_truncated_draft(target: str, folder: Path, layers: int = 1) -> str:
    """The target's first `layers` layers with its embeddings, final norm and head."""
    model = LlamaForCausalLM.from_pretrained(target, dtype=torch.float32)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    model.save_pretrained(folder)
    return str(folder)


def chi_square_p_value(counts: torch.Tensor, expected_probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson's goodness-of-fit p-value, pooling the cells expected fewer than `min_expected` times."""
    total = counts.sum()
    expected = expected_probs.double() * total
    big = expected >= min_expected
    observed, expected = counts[big].double(), expected[big]
    if not bool(big.all()):
        observed = torch.cat([observed, counts[~big].sum()[None].double()])
        expected = torch.cat([expected, (expected_probs.double()[~big].sum() * total)[None]])
    statistic = ((observed - expected) ** 2 / expected).sum()
    dof = observed.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), statistic / 2.0))
