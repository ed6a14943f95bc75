"""Small steps of the Llama decoder as one call of the engine's CPU kernels.

With up to `SMALL_BATCH_MAX_ROWS` tokens, a step of a small model costs more in calling some
fifteen operators per layer from Python (module calls, argument parsing, dispatch) than in the
operators themselves: the demo model's layers spend about as long there as in their matmuls.
Such steps are decode steps of a few sequences, and speculative decoding's: the target verifying
1 + k tokens of a sequence, the draft catching up on the tokens accepted since its last proposal.
`decode_layers` (csrc/cpu_kernels.cpp) runs the same kernels in the same order as the model's
layers do with `cpu_kernels` on, so it gives the same numbers, for every layer and the final norm,
in one call; the embedding and the LM head stay in Python. `greedy_proposals` goes one step
further for a greedy draft: several decode steps, each fed the previous one's argmax, in one call.

It applies only where those kernels are what the layers would run: a float32 model on a CPU with
the kernels loaded, one tensor-parallel rank, linear layers in float32 or in the engine's packed
formats (`native-int8`, `native-int4`), the `cpu-kernel` attention.
"""

from __future__ import annotations

import torch

from engine.model.attention import CpuPagedAttention, StepBatch
from engine.model.linear import UnquantizedLinearMethod
from engine.model.llama import LlamaForCausalLM
from engine.model.matmul import SMALL_BATCH_MAX_ROWS
from engine.model.packed_linear import PackedLinear


def _weight_and_scales(linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A linear layer's weight as `decode_layers` takes it: float32 with no scales, or packed with its scales."""
    packed = getattr(linear, "quantized", None)
    if isinstance(packed, PackedLinear):
        return packed.packed, packed.scales
    return linear.weight, None


def _layer_tensors(layer) -> list[torch.Tensor | None]:
    """The fourteen tensors `decode_layers` takes per layer, in its order (None where the model has none): norms,
    weights and biases, then the four linear layers' scales (None for float32 weights)."""
    attention, mlp = layer.self_attn, layer.mlp
    linears = (attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj)
    (qkv, qkv_scales), (out, out_scales), (gate_up, gate_up_scales), (down, down_scales) = (
        _weight_and_scales(linear) for linear in linears)
    return [layer.input_layernorm.weight, qkv, attention.qkv_proj.bias,
            attention.q_norm.weight if attention.qk_norm else None,
            attention.k_norm.weight if attention.qk_norm else None,
            out, attention.o_proj.bias, layer.post_attention_layernorm.weight, gate_up, down,
            qkv_scales, out_scales, gate_up_scales, down_scales]


def _kernel_linear(linear) -> bool:
    """Whether `decode_layers` computes this layer as the model would: the small-batch kernel on a float32 weight,
    or the packed kernel on one of the engine's formats."""
    if linear.parallel.size != 1:
        return False
    if isinstance(linear.method, UnquantizedLinearMethod):
        return linear.matmul_plan.small_batch_kernel
    return isinstance(getattr(linear, "quantized", None), PackedLinear)


def supports_fused_decode(model: LlamaForCausalLM) -> bool:
    """Whether every layer computes with the kernels `decode_layers` runs."""
    layers = model.model.layers
    linears = [m for layer in layers for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                               layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    norms = [model.model.norm] + [n for layer in layers for n in (layer.input_layernorm,
                                                                  layer.post_attention_layernorm)]
    return (all(_kernel_linear(m) for m in linears)
            and all(n.fused for n in norms) and all(layer.self_attn.fused and layer.mlp.fused for layer in layers)
            and all(isinstance(layer.self_attn.attention, CpuPagedAttention) for layer in layers))


class FusedDecode:
    """Runs a small-batch decode step's decoder layers in one kernel call (see the module docstring)."""

    def __init__(self, model: LlamaForCausalLM):
        self.model = model
        self.layers = [t for layer in model.model.layers for t in _layer_tensors(layer)]
        spec = model.spec
        attention = model.model.layers[0].self_attn
        self.shape = (attention.heads.local_heads, attention.heads.local_kv_heads, spec.head_dim)
        self.eps = spec.rms_norm_eps
        self.scale = attention.attention.scale
        self.block_size = attention.attention.block_size

    @staticmethod
    def applies(batch: StepBatch) -> bool:
        """Steps of at most `SMALL_BATCH_MAX_ROWS` tokens, however they split into sequences: a decode step of a
        few sequences, a speculative verification of 1 + k tokens, a draft model's catch-up."""
        return sum(batch.query_lens) <= SMALL_BATCH_MAX_ROWS

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches, batch: StepBatch) -> torch.Tensor:
        """Final (normed) hidden states [sequences, hidden] of a decode step; K/V go into `kv_caches`."""
        model = self.model
        embedded = model.model.embed_tokens(input_ids)
        cos = model.rope_cos[positions].to(embedded.dtype)
        sin = model.rope_sin[positions].to(embedded.dtype)
        caches = [cache for pair in kv_caches for cache in pair]
        heads, kv_heads, head_dim = self.shape
        return torch.ops.playground_cpu.decode_layers(
            embedded, cos, sin, self.layers, model.model.norm.weight, caches, batch.slot_mapping,
            batch.block_tables, batch.query_start, batch.query_len, batch.context_lens, heads, kv_heads, head_dim,
            self.block_size, self.eps, self.scale)

    @property
    def proposes_greedily(self) -> bool:
        """Whether `greedy_proposals` computes what the Python loop would: the LM head and the embedding unsplit,
        the LM head on the small-batch kernel (what `compute_logits` runs for up to 8 rows)."""
        model = self.model
        return (model.lm_head.parallel.size == 1 and model.model.embed_tokens.parallel.size == 1
                and model.lm_head.method is None and model.lm_head.matmul_plan.small_batch_kernel)

    def greedy_proposals(self, chunk_tokens: torch.Tensor, chunk_positions: torch.Tensor, chunk_lens: torch.Tensor,
                         steps: torch.Tensor, block_tables: torch.Tensor, kv_caches, vocab_limit: int) -> torch.Tensor:
        """[sequences, max(steps)] greedy continuations of each sequence's chunk (-1 past a row's last), all steps
        in one kernel call (see `greedy_proposals` in csrc/cpu_kernels.cpp)."""
        model = self.model
        caches = [cache for pair in kv_caches for cache in pair]
        heads, kv_heads, head_dim = self.shape
        return torch.ops.playground_cpu.greedy_proposals(
            chunk_tokens, chunk_positions, chunk_lens, steps, block_tables, model.model.embed_tokens.weight,
            model.lm_head.weight, min(vocab_limit, model.spec.vocab_size), model.rope_cos, model.rope_sin,
            self.layers, model.model.norm.weight, caches, heads, kv_heads, head_dim, self.block_size, self.eps,
            self.scale)
