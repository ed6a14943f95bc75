"""GQA / MQA conversion of a checkpoint's key and value heads (`gqa`): the head count it asks for, and the
regrouping of each K and V tensor while it loads.

`gqa="mha"` gives every query head its own KV head by repeating each KV head over its group: the
same attention, hence the same outputs, with a bigger KV cache (what GQA saves, made visible).
An integer number of KV heads below the checkpoint's mean-pools the key and value projection
heads of each group into one, as the GQA paper (Ainslie et al., 2023) converts a multi-head
checkpoint before uptraining; without the uptraining quality drops, and the perplexity shows by
how much. Query head h keeps reading KV head h // (query heads / KV heads) in both directions.

The engine's plan decides the head count once (`convert_spec`): the model is built with it (so the
QKV layer, the KV cache and the blocks that fit `kv_cache_bytes` follow it), and the spec keeps the
checkpoint's count, so the QKV layer's loader regroups each K and V tensor (`regroup_kv_heads`)
before placing it. Nothing else converts heads.
"""

from __future__ import annotations

import torch

from engine.errors import ConfigError
from engine.model.spec import ModelSpec


def kv_head_options(num_heads: int, num_kv_heads: int) -> list[int]:
    """KV head counts a checkpoint converts to: divisors of the query heads that pool or repeat whole groups."""
    return [n for n in range(1, num_heads + 1)
            if num_heads % n == 0 and (num_kv_heads % n == 0 or n % num_kv_heads == 0)]


def resolve_kv_heads(gqa: str | int, num_heads: int, num_kv_heads: int) -> int:
    """The number of KV heads `gqa` asks for on a checkpoint with these heads, or one clear error."""
    if gqa == "native":
        return num_kv_heads
    if gqa == "mha":
        return num_heads
    options = kv_head_options(num_heads, num_kv_heads)
    if gqa not in options:
        raise ConfigError(f"gqa={gqa}: this model has {num_heads} query heads and {num_kv_heads} KV heads, so its "
                          f"KV heads convert to one of {', '.join(map(str, options))} (or 'native' / 'mha')")
    return gqa


def convert_spec(spec: ModelSpec, gqa: str | int) -> ModelSpec:
    """The shapes the model is built with under `gqa`, remembering the checkpoint's KV heads for its loader."""
    stored = spec.stored_kv_heads
    heads = resolve_kv_heads(gqa, spec.num_heads, stored)
    return spec.replace(num_kv_heads=heads, checkpoint_kv_heads=None if heads == stored else stored)


def regroup_kv_heads(tensor: torch.Tensor, from_heads: int, to_heads: int) -> torch.Tensor:
    """A K or V projection (weight [heads * head_dim, in] or bias [heads * head_dim]) with `to_heads` heads.

    Fewer heads: the mean of each group of consecutive heads (computed in float32). More: each head
    repeated over its group.
    """
    heads = tensor.unflatten(0, (from_heads, -1))
    if to_heads < from_heads:
        pooled = heads.float().unflatten(0, (to_heads, from_heads // to_heads)).mean(dim=1)
        return pooled.to(tensor.dtype).flatten(0, 1)
    return heads.repeat_interleave(to_heads // from_heads, dim=0).flatten(0, 1)

