"""`ModelSpec`: the architecture switches of one checkpoint, read once from its HF config.

The Llama family (Llama, Mistral, Qwen2, Qwen3; SmolLM and TinyLlama are Llama) differs only in
switches read from config.json: QKV bias (Qwen2), per-head Q/K RMSNorm and an explicit head_dim
(Qwen3), RoPE scaling (Llama 3), tied embeddings, a sliding window.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

NATIVE_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def checkpoint_architecture(hf_config) -> str:
    """The model class a checkpoint's config.json names ("unknown" when it names none)."""
    return (getattr(hf_config, "architectures", None) or ["unknown"])[0]


@dataclass(frozen=True)
class ModelSpec:
    """The shapes and switches the native model is built from."""

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
    # The checkpoint's KV heads when `gqa` builds the model with another count (its loader regroups them);
    # None when the model has the checkpoint's own heads.
    checkpoint_kv_heads: int | None = None

    @classmethod
    def from_hf_config(cls, config) -> ModelSpec:
        architecture = checkpoint_architecture(config)
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

    @property
    def stored_kv_heads(self) -> int:
        """The KV heads the checkpoint's K and V tensors hold."""
        return self.checkpoint_kv_heads or self.num_kv_heads

    def replace(self, **changes) -> ModelSpec:
        return dataclasses.replace(self, **changes)
