"""Small random checkpoints of every architecture the native engine covers, saved in HF format.

Weights use a wide init (std 0.2) so logits are peaked: greedy comparisons then test the engine,
not float noise between near-tied tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

VOCAB = 384
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              max_position_embeddings=512, initializer_range=0.2, bos_token_id=1, eos_token_id=2)
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

TINY_ARCHITECTURES = {
    "llama-gqa": (LlamaConfig, LlamaForCausalLM, dict(num_attention_heads=4, num_key_value_heads=2)),
    "llama-mqa-tied": (LlamaConfig, LlamaForCausalLM,
                       dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)),
    "llama3-rope-scaling": (LlamaConfig, LlamaForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=4,
        rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 128})),
    "mistral": (MistralConfig, MistralForCausalLM, dict(num_attention_heads=4, num_key_value_heads=2,
                                                        sliding_window=None)),
    "qwen2-qkv-bias": (Qwen2Config, Qwen2ForCausalLM, dict(num_attention_heads=4, num_key_value_heads=2)),
    "qwen3-qk-norm": (Qwen3Config, Qwen3ForCausalLM, dict(num_attention_heads=4, num_key_value_heads=2,
                                                         head_dim=32)),
}


def build_tiny_model(name: str, folder: Path, seed: int = 0) -> str:
    config_class, model_class, extra = TINY_ARCHITECTURES[name]
    torch.manual_seed(seed)
    model = model_class(config_class(**COMMON, **extra)).eval()
    model.save_pretrained(folder)
    return str(folder)


def build_tiny_tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of VOCAB ids with chat tokens, trained on a few sentences."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "<|im_end|>", "<|im_start|>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["The engine batches requests together.", "Paged attention stores keys and values in blocks.",
            "héllo wörld, naïve café — ünïcode ✓", "def add(a, b):\n    return a + b"] * 20
    tokenizer.train_from_iterator(text, trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="<|im_end|>",
                                      unk_token="<unk>", pad_token="<unk>")
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(folder)
    return wrapped


def build_tiny_chat_model(folder: Path, seed: int = 0, **fields) -> str:
    """A random Llama with a real tokenizer and chat template, for text, stop-string and chat tests; `fields`
    override the config (e.g. a shape that a quantization kernel accepts)."""
    tokenizer = build_tiny_tokenizer(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(**{**COMMON, "vocab_size": len(tokenizer), "num_attention_heads": 4,
                            "num_key_value_heads": 2, **fields})
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    return str(folder)
