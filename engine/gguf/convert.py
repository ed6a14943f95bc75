"""A Llama checkpoint (safetensors) as a float32 GGUF file for llama.cpp's "llama" architecture.

Why float32 only: the engine's float32 output is the reference, so the first file holds exactly the checkpoint's
numbers; every smaller type is made from it by llama.cpp's own quantizer (`files.py`), so its formats are llama.cpp's
and not an imitation of them.

The one change to the numbers' order: transformers' Llama rotates the two halves of each head's Q and K rows
(`rotate_half`), while llama.cpp's "llama" RoPE rotates adjacent pairs. The rows of each Q and K head are therefore
interleaved (half i, half i + d/2 -> rows 2i, 2i + 1), which gives the same attention scores. Other architectures,
biases, sliding windows and RoPE scalings llama.cpp's "llama" does not read the same way are refused.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from engine.errors import ModelLoadError
from engine.gguf.vocab import GGUFVocab, write_vocab
from engine.model.spec import ModelSpec, checkpoint_architecture
from engine.model.weights import safetensors_files
from engine.quant.checkpoint import prequantized_method

CONVERTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
ROPE_TYPES = ("default", "linear", "llama3")
FILE_TYPE_ALL_F32 = 0  # llama.cpp's LLAMA_FTYPE_ALL_F32
LAYER_TENSORS = {  # checkpoint name inside model.layers.N -> GGUF name inside blk.N
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight"}
MODEL_TENSORS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}


def unconvertible_reason(hf_config) -> str | None:
    """Why this checkpoint is not converted to GGUF here, or None."""
    architecture = checkpoint_architecture(hf_config)
    if architecture not in CONVERTED_ARCHITECTURES:
        return (f"architecture {architecture} is not converted to GGUF here (only "
                f"{', '.join(CONVERTED_ARCHITECTURES)}, as llama.cpp's 'llama')")
    if prequantized_method(hf_config):
        return f"a pre-quantized ({prequantized_method(hf_config)}) checkpoint is not converted to GGUF here"
    spec = ModelSpec.from_hf_config(hf_config)
    if spec.qkv_bias or spec.o_bias or getattr(hf_config, "mlp_bias", False):
        return "checkpoints with attention or MLP biases are not converted to GGUF here"
    if spec.sliding_window is not None:
        return "a sliding-window checkpoint is not converted to GGUF here (llama.cpp's 'llama' attends to everything)"
    rope_type = _rope(hf_config).get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        return f"RoPE type {rope_type!r} is not converted to GGUF here (only {', '.join(ROPE_TYPES)})"
    return None


def _rope(hf_config) -> dict:
    return dict(getattr(hf_config, "rope_parameters", None) or {})


def interleave_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Q or K rows [heads * head_dim, in] from transformers' half-split rotary order to llama.cpp's pairs."""
    rows, columns = weight.shape
    half = rows // num_heads // 2
    return weight.reshape(num_heads, 2, half, columns).transpose(1, 2).reshape(rows, columns)


def llama3_rope_factors(hf_config, spec: ModelSpec) -> torch.Tensor:
    """Llama 3's per-frequency divisors of the rotary angles, as llama.cpp reads them (`rope_freqs.weight`)."""
    rope = _rope(hf_config)
    base = rope.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (torch.arange(0, spec.head_dim, 2, dtype=torch.float64) / spec.head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_context = rope["original_max_position_embeddings"]
    factors = []
    for freq in freqs.tolist():
        wavelength = 2 * math.pi / freq
        if wavelength < old_context / high:
            factors.append(1.0)
        elif wavelength > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32)


def _gguf_name(name: str) -> str | None:
    if name in MODEL_TENSORS:
        return MODEL_TENSORS[name]
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in LAYER_TENSORS:
        return f"blk.{parts[2]}.{LAYER_TENSORS[parts[3]]}"
    return None  # rotary buffers and the like: nothing llama.cpp reads


def _tensors(path: Path, spec: ModelSpec) -> dict[str, tuple[Path, str, tuple[int, ...]]]:
    """GGUF name -> (file, checkpoint name, shape), in the order they are written; a tied LM head is left out."""
    found: dict[str, tuple[Path, str, tuple[int, ...]]] = {}
    for file in safetensors_files(path):
        with safe_open(file, framework="pt") as handle:
            for name in handle.keys():
                target = _gguf_name(name)
                if target is not None and not (target == "output.weight" and spec.tie_word_embeddings):
                    found[target] = (file, name, tuple(handle.get_slice(name).get_shape()))
    expected = {"token_embd.weight", "output_norm.weight",
                *(f"blk.{layer}.{part}" for layer in range(spec.num_layers) for part in LAYER_TENSORS.values())}
    if not spec.tie_word_embeddings:
        expected.add("output.weight")
    missing = sorted(expected - set(found))
    if missing:
        raise ModelLoadError(f"the checkpoint in {path.name} lacks {len(missing)} tensor(s) a Llama has, e.g. "
                             f"{missing[0]}")
    return found


def _array(file: Path, name: str, target: str, spec: ModelSpec) -> np.ndarray:
    with safe_open(file, framework="pt") as handle:
        tensor = handle.get_tensor(name).to(torch.float32)
    if target.endswith("attn_q.weight"):
        tensor = interleave_rotary_rows(tensor, spec.num_heads)
    elif target.endswith("attn_k.weight"):
        tensor = interleave_rotary_rows(tensor, spec.num_kv_heads)
    return np.ascontiguousarray(tensor.numpy())


def _write_parameters(writer, hf_config, spec: ModelSpec, name: str) -> None:
    rope = _rope(hf_config)
    writer.add_name(name)
    writer.add_file_type(FILE_TYPE_ALL_F32)
    writer.add_block_count(spec.num_layers)
    writer.add_context_length(spec.max_position_embeddings)
    writer.add_embedding_length(spec.hidden_size)
    writer.add_feed_forward_length(spec.intermediate_size)
    writer.add_head_count(spec.num_heads)
    writer.add_head_count_kv(spec.num_kv_heads)
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(spec.rms_norm_eps))
    if rope.get("rope_type") == "linear":
        import gguf

        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))


def convert_checkpoint(path: Path, hf_config, vocab: GGUFVocab, destination: Path) -> None:
    """Write the float32 GGUF of the Llama checkpoint in `path` to `destination` (through a temporary file beside
    it, so a reader never sees half a file). Raises ModelLoadError for a checkpoint it does not convert."""
    import gguf

    reason = unconvertible_reason(hf_config)
    if reason:
        raise ModelLoadError(reason)
    spec = ModelSpec.from_hf_config(hf_config)
    tensors = _tensors(path, spec)
    extra = {}
    if _rope(hf_config).get("rope_type") == "llama3":
        extra["rope_freqs.weight"] = llama3_rope_factors(hf_config, spec).numpy()
    partial = destination.with_name(f".{destination.name}.{os.getpid()}.partial")
    writer = gguf.GGUFWriter(partial, "llama")
    try:
        _write_parameters(writer, hf_config, spec, path.name)
        write_vocab(writer, vocab)
        for target, (_, _, shape) in tensors.items():
            writer.add_tensor_info(target, shape, np.dtype(np.float32), 4 * math.prod(shape))
        for target, array in extra.items():
            writer.add_tensor_info(target, array.shape, array.dtype, array.nbytes)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for target, (file, name, _) in tensors.items():
            writer.write_tensor_data(_array(file, name, target, spec))
        for array in extra.values():
            writer.write_tensor_data(array)
        writer.close()
        os.replace(partial, destination)
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise
