"""The native decoder for the Llama family over a flat batch of tokens.

The module tree mirrors the checkpoints' (`model.layers.N.self_attn...`), except that Q/K/V and
gate/up are fused; `packed_modules_mapping` says which checkpoint tensor goes into which fused
layer as which part, so loading is a name substitution plus each layer's own `weight_loader`.
The forward pass takes every sequence's new tokens concatenated, their positions and the step's
attention metadata; KV heads and query heads are this rank's share under tensor parallelism.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model import cpu_kernels
from engine.model.linear import (
    BuildContext,
    HeadLayout,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from engine.model.norm import RMSNorm
from engine.model.rotary import rotate_queries_and_keys
from engine.model.spec import ModelSpec


def make_norm(size: int, spec: ModelSpec, build: BuildContext) -> RMSNorm:
    return RMSNorm(size, spec.rms_norm_eps, build.dtype, build.device, build.cpu_kernels)


class LlamaAttention(nn.Module):
    """QKV projection, optional Q/K norm, RoPE, attention over the KV cache, output projection."""

    def __init__(self, spec: ModelSpec, attention, build: BuildContext, prefix: str):
        super().__init__()
        self.heads = HeadLayout(spec.num_heads, spec.num_kv_heads, spec.head_dim, build.parallel)
        self.qkv_proj = QKVParallelLinear(spec.hidden_size, self.heads, spec.qkv_bias, build, f"{prefix}.qkv_proj",
                                          spec.checkpoint_kv_heads)
        self.o_proj = RowParallelLinear(spec.num_heads * spec.head_dim, spec.hidden_size, spec.o_bias, build,
                                        f"{prefix}.o_proj")
        if spec.qk_norm:
            self.q_norm = make_norm(spec.head_dim, spec, build)
            self.k_norm = make_norm(spec.head_dim, spec, build)
        self.qk_norm = spec.qk_norm
        self.attention = attention
        self.fused = build.cpu_kernels

    def forward(self, hidden, cos, sin, k_cache, v_cache, meta) -> torch.Tensor:
        tokens, dim = hidden.shape[0], self.heads.head_dim
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.qkv_proj.q_size, self.qkv_proj.kv_size, self.qkv_proj.kv_size], -1)
        q = q.view(tokens, -1, dim)
        k = k.view(tokens, -1, dim)
        v = v.view(tokens, -1, dim)
        if self.qk_norm:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q, k = rotate_queries_and_keys(q, k, cos, sin, self.fused)
        attended = self.attention(q, k, v, k_cache, v_cache, meta)
        return self.o_proj(attended.reshape(tokens, -1))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up as one matmul."""

    def __init__(self, spec: ModelSpec, build: BuildContext, prefix: str):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(spec.hidden_size, [spec.intermediate_size] * 2, False, build,
                                                       f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(spec.intermediate_size, spec.hidden_size, False, build,
                                           f"{prefix}.down_proj")
        self.fused = build.cpu_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.fused:
            return self.down_proj(cpu_kernels.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, attention, build: BuildContext, prefix: str):
        super().__init__()
        self.input_layernorm = make_norm(spec.hidden_size, spec, build)
        self.self_attn = LlamaAttention(spec, attention, build, f"{prefix}.self_attn")
        self.post_attention_layernorm = make_norm(spec.hidden_size, spec, build)
        self.mlp = LlamaMLP(spec, build, f"{prefix}.mlp")

    def forward(self, hidden, cos, sin, k_cache, v_cache, meta) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(hidden), cos, sin, k_cache, v_cache, meta)
        normed, hidden = self.post_attention_layernorm.add_and_norm(attended, hidden)
        return hidden + self.mlp(normed)


class LlamaModel(nn.Module):
    def __init__(self, spec: ModelSpec, attention, build: BuildContext):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, build)
        self.layers = nn.ModuleList(LlamaDecoderLayer(spec, attention, build, f"model.layers.{i}")
                                    for i in range(spec.num_layers))
        self.norm = make_norm(spec.hidden_size, spec, build)


class LlamaForCausalLM(nn.Module):
    """Embeddings, decoder layers, final norm and LM head; `forward` gives hidden states, `compute_logits` logits."""

    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }
    ignored_checkpoint_tensors = ("rotary_emb.inv_freq",)

    def __init__(self, spec: ModelSpec, attention, build: BuildContext, cos: torch.Tensor, sin: torch.Tensor):
        super().__init__()
        self.spec = spec
        self.model = LlamaModel(spec, attention, build)
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size, build)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
            self.lm_head.tied_to_embedding = True
        self.rope_cos = cos.to(build.device)
        self.rope_sin = sin.to(build.device)

    def forward(self, input_ids, positions, kv_caches, meta) -> torch.Tensor:
        """Final hidden states [tokens, hidden] for a flat batch; K/V go into `kv_caches`."""
        hidden = self.model.embed_tokens(input_ids)
        cos = self.rope_cos[positions].to(hidden.dtype).unsqueeze(1)
        sin = self.rope_sin[positions].to(hidden.dtype).unsqueeze(1)
        for layer, (k_cache, v_cache) in zip(self.model.layers, kv_caches, strict=True):
            hidden = layer(hidden, cos, sin, k_cache, v_cache, meta)
        return self.model.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits over the whole vocabulary."""
        return self.lm_head.compute_logits(hidden)
