"""`ParallelContext`: which shard of the model this process holds, and how shards combine.

Every layer that can be split for tensor parallelism takes one. With `size == 1` (the default,
one process) every collective is the identity, so the same layers serve both cases; worker
processes pass a context whose `group` is a `torch.distributed` process group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ParallelContext:
    """Rank and world size of this model shard, and the group its collectives run over."""

    rank: int = 0
    size: int = 1
    group: object | None = None

    def split(self, total: int, what: str) -> tuple[int, int]:
        """(start, length) of this rank's even share of `total` items; an uneven split is an error."""
        if total % self.size:
            raise ValueError(f"{what} ({total}) does not divide evenly over {self.size} tensor-parallel ranks")
        length = total // self.size
        return self.rank * length, length

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over all ranks, in place."""
        if self.size > 1:
            import torch.distributed as dist

            dist.all_reduce(tensor, group=self.group)
        return tensor

    def all_gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's `tensor` along its last dimension, in rank order."""
        if self.size == 1:
            return tensor
        import torch.distributed as dist

        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


SINGLE_PROCESS = ParallelContext()
