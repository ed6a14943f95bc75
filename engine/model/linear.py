"""Linear layers that own their weight loading, split for tensor parallelism, computed by a method.

Checkpoints store Q, K and V (and gate and up) as separate tensors; the model fuses each group
into one projection, so a step runs one large matmul instead of three. Each layer's
`weight_loader` knows where a checkpoint tensor goes (its "shard id": "q"/"k"/"v", or the index
of a merged part) and, with tensor parallelism, which slice of it this rank keeps: column-parallel
layers split their outputs, row-parallel layers their inputs (followed by an all-reduce). The
checkpoint walker (`weights.py`) only maps names and calls loaders.

How a layer stores and multiplies its weight is its `LinearMethod`: a plain matmul here; a
quantization library's packed weight in `engine/quant/`. A method may keep the loaded weight
off the accelerator until `process_weights_after_loading`, so full-precision weights never have
to fit on the GPU before they are quantized.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from engine.model import matmul
from engine.model.gqa import regroup_kv_heads
from engine.model.huge_pages import advise_huge_pages
from engine.model.matmul import plan_matmul
from engine.model.parallel import SINGLE_PROCESS, ParallelContext


class LinearMethod(Protocol):
    """Creates, finishes and applies one linear layer's weight."""

    def create_weights(self, layer: LinearBase, input_size: int, output_size: int) -> None:
        """Register `layer.weight` (with `weight_loader` set by the layer afterwards)."""

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        """Turn the loaded weight into what `apply` computes with (pack, quantize, move)."""

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ weight.T (+ bias)."""


class UnquantizedLinearMethod:
    """The weight in the model's dtype on the model's device, [out, in] as loaded; multiplied in the form
    measured fastest for its shape (model/matmul.py)."""

    def create_weights(self, layer: LinearBase, input_size: int, output_size: int) -> None:
        build = layer.build
        weight = torch.empty(output_size, input_size, dtype=build.dtype, device=build.device)
        advise_huge_pages(weight)
        layer.weight = nn.Parameter(weight, requires_grad=False)
        layer.matmul_plan = plan_matmul(output_size, input_size, build.dtype, build.device, build.cpu_kernels)

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        return None

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return matmul.linear(layer.matmul_plan, x, layer.weight, bias)


@dataclass(frozen=True)
class BuildContext:
    """Where and how a model's layers are built: dtype, device, shard, and each linear layer's method.

    `linear_method` picks the method for a layer from its qualified name (e.g.
    "model.layers.0.mlp.down_proj"), so a quantization level can leave some layers unquantized.
    `cpu_kernels`: compute with the engine's C++ CPU kernels (model/cpu_kernels.py); only set for a
    float32 model on a CPU with the library loaded. `lm_head_method`, when set, makes the method that
    stores and multiplies the LM head's weight (a level that packs the head as well).
    """

    dtype: torch.dtype
    device: torch.device | str
    parallel: ParallelContext = SINGLE_PROCESS
    linear_method: Callable[[str], LinearMethod] = field(default=lambda prefix: UnquantizedLinearMethod())
    cpu_kernels: bool = False
    lm_head_method: Callable[[], LinearMethod] | None = None


def _check_shape(param: torch.Tensor, loaded: torch.Tensor) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"shape {tuple(loaded.shape)} does not fit the layer's {tuple(param.shape)}")


def _check_rows(loaded: torch.Tensor, rows: int, what: str) -> None:
    """A checkpoint tensor must have exactly the rows its (unsharded) place in the layer has."""
    if loaded.shape[0] != rows:
        raise ValueError(f"{what} has {loaded.shape[0]} rows, expected {rows}")


class LinearBase(nn.Module):
    """A linear layer of local (per-rank) size `input_size` -> `output_size` and its loader."""

    shard_ids: tuple = (None,)

    def __init__(self, input_size: int, output_size: int, bias: bool, build: BuildContext, prefix: str,
                 bias_size: int | None = None):
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.build = build
        self.parallel = build.parallel
        self.prefix = prefix
        self.method = build.linear_method(prefix)
        self.method.create_weights(self, input_size, output_size)
        self._attach_loader(self.weight)
        if bias:
            self.bias = nn.Parameter(torch.empty(bias_size or output_size, dtype=build.dtype, device=build.device),
                                     requires_grad=False)
            self._attach_loader(self.bias)
        else:
            self.register_parameter("bias", None)

    def _attach_loader(self, param: torch.Tensor) -> None:
        param.weight_loader = self.weight_loader
        param.shard_ids = self.shard_ids

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        _check_shape(param, loaded)
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x, self.bias)


class MergedColumnParallelLinear(LinearBase):
    """Several column-parallel layers with one input stored as one (gate and up: one matmul).

    Checkpoint tensor `shard_id` (an index into `output_sizes`) fills its own rows, each split
    over ranks the same way, so rank r holds [gate_r; up_r].
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool, build: BuildContext, prefix: str):
        self.local_sizes = [build.parallel.split(size, f"{prefix} part {i}")[1] for i, size in enumerate(output_sizes)]
        self.shard_ids = tuple(range(len(output_sizes)))
        super().__init__(input_size, sum(self.local_sizes), bias, build, prefix)

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        if shard_id not in self.shard_ids:
            raise ValueError(f"{self.prefix} has parts {self.shard_ids}, not {shard_id!r}")
        length = self.local_sizes[shard_id]
        offset = sum(self.local_sizes[:shard_id])
        _check_rows(loaded, length * self.parallel.size, f"{self.prefix} part {shard_id}")
        loaded = loaded.narrow(0, self.parallel.rank * length, length)
        target = param.data.narrow(0, offset, length)
        _check_shape(target, loaded)
        target.copy_(loaded)


@dataclass(frozen=True)
class HeadLayout:
    """How attention heads are spread over tensor-parallel ranks.

    Query heads split evenly. KV heads split evenly when there are at least as many as ranks;
    with fewer (MQA, or GQA with many ranks) each rank keeps a copy of the one KV head its query
    heads use, as vLLM does.
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    parallel: ParallelContext

    def __post_init__(self):
        size = self.parallel.size
        if self.num_heads % size:
            raise ValueError(f"{self.num_heads} attention heads do not divide over {size} tensor-parallel ranks")
        if self.num_kv_heads >= size and self.num_kv_heads % size:
            raise ValueError(f"{self.num_kv_heads} KV heads do not divide over {size} tensor-parallel ranks")
        if self.num_kv_heads < size and size % self.num_kv_heads:
            raise ValueError(f"{size} tensor-parallel ranks cannot share {self.num_kv_heads} KV heads evenly")

    @property
    def local_heads(self) -> int:
        return self.num_heads // self.parallel.size

    @property
    def local_kv_heads(self) -> int:
        return max(1, self.num_kv_heads // self.parallel.size)

    @property
    def first_kv_head(self) -> int:
        """The first checkpoint KV head this rank holds."""
        if self.num_kv_heads >= self.parallel.size:
            return self.parallel.rank * self.local_kv_heads
        return self.parallel.rank * self.num_kv_heads // self.parallel.size


class QKVParallelLinear(LinearBase):
    """Q, K and V projections fused into one column-parallel layer: [q_r; k_r; v_r] on rank r."""

    shard_ids = ("q", "k", "v")

    def __init__(self, hidden_size: int, heads: HeadLayout, bias: bool, build: BuildContext, prefix: str,
                 checkpoint_kv_heads: int | None = None):
        self.heads = heads
        self.checkpoint_kv_heads = checkpoint_kv_heads or heads.num_kv_heads
        self.q_size = heads.local_heads * heads.head_dim
        self.kv_size = heads.local_kv_heads * heads.head_dim
        super().__init__(hidden_size, self.q_size + 2 * self.kv_size, bias, build, prefix)

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        heads, dim = self.heads, self.heads.head_dim
        if shard_id == "q":
            offset, length, source = 0, self.q_size, self.parallel.rank * self.q_size
            _check_rows(loaded, heads.num_heads * dim, f"{self.prefix} q")
        elif shard_id in ("k", "v"):
            if self.checkpoint_kv_heads != heads.num_kv_heads:  # `gqa` converts the checkpoint's KV heads
                _check_rows(loaded, self.checkpoint_kv_heads * dim, f"{self.prefix} {shard_id}")
                loaded = regroup_kv_heads(loaded, self.checkpoint_kv_heads, heads.num_kv_heads)
            offset = self.q_size + (self.kv_size if shard_id == "v" else 0)
            length, source = self.kv_size, heads.first_kv_head * dim
            _check_rows(loaded, heads.num_kv_heads * dim, f"{self.prefix} {shard_id}")
        else:
            raise ValueError(f"{self.prefix} has parts q, k, v, not {shard_id!r}")
        loaded = loaded.narrow(0, source, length)
        target = param.data.narrow(0, offset, length)
        _check_shape(target, loaded)
        target.copy_(loaded)


class RowParallelLinear(LinearBase):
    """Inputs split over ranks; each rank's partial product is summed by an all-reduce.

    The bias is added once (by rank 0) so the sum counts it once.
    """

    def __init__(self, input_size: int, output_size: int, bias: bool, build: BuildContext, prefix: str):
        _, local = build.parallel.split(input_size, f"{prefix} inputs")
        super().__init__(local, output_size, bias, build, prefix, bias_size=output_size)

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        if loaded.dim() == 2:
            if loaded.shape[1] != self.input_size * self.parallel.size:
                raise ValueError(f"{self.prefix} has {loaded.shape[1]} inputs, expected "
                                 f"{self.input_size * self.parallel.size}")
            start, length = self.parallel.split(loaded.shape[1], f"{self.prefix} inputs")
            loaded = loaded.narrow(1, start, length)
        _check_shape(param, loaded)
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.parallel.rank == 0 else None
        return self.parallel.all_reduce(self.method.apply(self, x, bias))


class VocabParallelEmbedding(nn.Module):
    """Embedding rows split over ranks (padded to an even split); lookups summed by an all-reduce."""

    shard_ids = (None,)

    def __init__(self, vocab_size: int, hidden_size: int, build: BuildContext):
        super().__init__()
        self.vocab_size = vocab_size
        self.parallel = build.parallel
        self.rows = -(-vocab_size // build.parallel.size)
        self.first_row = build.parallel.rank * self.rows
        weight = torch.empty(self.rows, hidden_size, dtype=build.dtype, device=build.device)
        advise_huge_pages(weight)  # the LM head (or the tied embedding) streams through all of it every step
        self.weight = nn.Parameter(weight.zero_(), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.weight.shard_ids = self.shard_ids

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
        if loaded.shape[0] != self.vocab_size or loaded.shape[1:] != param.shape[1:]:
            raise ValueError(f"shape {tuple(loaded.shape)} does not fit ({self.vocab_size}, {param.shape[1]})")
        rows = loaded[self.first_row:self.first_row + self.rows]
        param.data[:rows.shape[0]].copy_(rows)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.parallel.size == 1:
            return F.embedding(token_ids, self.weight)
        local = token_ids - self.first_row
        inside = (local >= 0) & (local < self.rows)
        hidden = F.embedding(local.clamp(0, self.rows - 1), self.weight) * inside.unsqueeze(-1)
        return self.parallel.all_reduce(hidden)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits for this rank's vocabulary rows, gathered into the full vocabulary on every rank.

    With a `method` (a level that packs the head), the method computes them from its own copy of the
    weight, made once the checkpoint is loaded; `tied_to_embedding` tells it whether the float weight
    must stay for the embedding lookups.
    """

    def __init__(self, vocab_size: int, hidden_size: int, build: BuildContext):
        super().__init__(vocab_size, hidden_size, build)
        self.matmul_plan = plan_matmul(self.rows, hidden_size, build.dtype, build.device, build.cpu_kernels)
        self.method = build.lm_head_method() if build.lm_head_method else None
        self.tied_to_embedding = False

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.method is not None:
            local = self.method.apply(self, hidden, None)
        else:
            local = matmul.linear(self.matmul_plan, hidden, self.weight, None)
        return self.parallel.all_gather_last_dim(local)[..., :self.vocab_size].float()
