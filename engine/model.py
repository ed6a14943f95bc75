"""The native decoder for the Llama family: Llama, Mistral, Qwen2, Qwen3 (SmolLM and TinyLlama are Llama).

One module covers them all because they differ only in switches read from config.json:
QKV bias (Qwen2), per-head Q/K RMSNorm and an explicit head_dim (Qwen3), RoPE scaling
(Llama 3), tied embeddings. Q, K and V are one fused projection and gate/up another, so a step
runs two large matmuls instead of five. The forward pass takes a flat batch of tokens (every
sequence's new tokens concatenated) and the step's attention metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

NATIVE_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


@dataclass(frozen=True)
class ModelSpec:
    """The architecture switches of one checkpoint, read from its HF config."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    max_position_embeddings: int
    sliding_window: int | None

    @classmethod
    def from_hf_config(cls, config) -> ModelSpec:
        architecture = (config.architectures or [""])[0]
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        use_window = getattr(config, "use_sliding_window", True)
        return cls(
            architecture=architecture,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            head_dim=head_dim,
            intermediate_size=config.intermediate_size,
            rms_norm_eps=config.rms_norm_eps,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=bool(getattr(config, "attention_bias", False)) or architecture == "Qwen2ForCausalLM",
            o_bias=bool(getattr(config, "attention_bias", False)),
            qk_norm=architecture == "Qwen3ForCausalLM",
            max_position_embeddings=config.max_position_embeddings,
            sliding_window=getattr(config, "sliding_window", None) if use_window else None,
        )


def rope_cos_sin(hf_config, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [max_positions, head_dim], computed exactly as transformers does (scaled variants too)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = hf_config.rope_parameters.get("rope_type", "default")
    if rope_type == "default":
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        base = hf_config.rope_parameters["rope_theta"]
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        scaling = 1.0
    elif rope_type == "dynamic":
        raise ValueError("dynamic NTK RoPE rescales with the sequence length and is not supported natively")
    else:
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"))
    freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos() * scaling, angles.sin() * scaling


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, then scaled in the model dtype, as transformers does."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, attention):
        super().__init__()
        self.spec = spec
        self.q_size = spec.num_heads * spec.head_dim
        self.kv_size = spec.num_kv_heads * spec.head_dim
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.qkv_proj = nn.Linear(spec.hidden_size, self.q_size + 2 * self.kv_size, bias=spec.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, spec.hidden_size, bias=spec.o_bias)
        if spec.qk_norm:
            self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
            self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.gate_up_proj = nn.Linear(spec.hidden_size, 2 * spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)
        self.attention = attention

    def forward(self, hidden, cos, sin, k_cache, v_cache, meta):
        spec = self.spec
        tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(self.input_layernorm(hidden)).split([self.q_size, self.kv_size, self.kv_size], -1)
        q = q.view(tokens, spec.num_heads, spec.head_dim)
        k = k.view(tokens, spec.num_kv_heads, spec.head_dim)
        v = v.view(tokens, spec.num_kv_heads, spec.head_dim)
        if spec.qk_norm:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        attended = self.attention(q, k, v, k_cache, v_cache, meta)
        hidden = hidden + self.o_proj(attended.reshape(tokens, self.q_size))
        gate, up = self.gate_up_proj(self.post_attention_layernorm(hidden)).chunk(2, dim=-1)
        return hidden + self.down_proj(F.silu(gate) * up)


class LlamaFamilyModel(nn.Module):
    """Embeddings, decoder layers, final norm and LM head over a flat batch of tokens."""

    def __init__(self, spec: ModelSpec, attention, cos: torch.Tensor, sin: torch.Tensor):
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec, attention) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.tie_weights()
        self.rope_cos = cos
        self.rope_sin = sin

    def tie_weights(self) -> None:
        """Share the LM head with the embeddings when the checkpoint says so (again after materializing)."""
        if self.spec.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids, positions, kv_caches, meta) -> torch.Tensor:
        """Final hidden states [tokens, hidden] for a flat batch; K/V go into `kv_caches`."""
        hidden = self.embed_tokens(input_ids)
        cos = self.rope_cos[positions].to(hidden.dtype).unsqueeze(1)
        sin = self.rope_sin[positions].to(hidden.dtype).unsqueeze(1)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            hidden = layer(hidden, cos, sin, k_cache, v_cache, meta)
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
