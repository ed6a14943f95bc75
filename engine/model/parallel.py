"""`ParallelContext`: which shard of the model this process holds, and how shards combine.

Every layer that can be split for tensor parallelism takes one. With `size == 1` (the default,
one process) every collective is the identity, so the same layers serve both cases; worker
processes pass a context whose `group` is a `torch.distributed` process group and whose
`timer` adds up the time spent inside collectives (the cost tensor parallelism pays for
splitting the work, shown by `engine.stats()`).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


class CollectiveTimer:
    """Seconds spent inside collectives, waiting for the slowest rank included.

    On a CPU (gloo) a collective returns when it is done, so wall-clock time is exact. On a GPU
    (NCCL) it is only enqueued: the time is measured between CUDA events around it and read once
    the step's result has been copied back (which waits for the stream).
    """

    def __init__(self, cuda: bool = False):
        self.cuda = cuda
        self.calls = 0
        self._seconds = 0.0
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def measure(self):
        self.calls += 1
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._pending.append((start, end))
            return
        started = time.perf_counter()
        yield
        self._seconds += time.perf_counter() - started

    @property
    def seconds(self) -> float:
        """Total so far; on a GPU, call after the step's results are on the host."""
        if self._pending:
            self._seconds += sum(start.elapsed_time(end) for start, end in self._pending) / 1000.0
            self._pending.clear()
        return self._seconds


@dataclass(frozen=True)
class ParallelContext:
    """Rank and world size of this model shard, the group its collectives run over, and their timer."""

    rank: int = 0
    size: int = 1
    group: object | None = None
    timer: CollectiveTimer = field(default_factory=CollectiveTimer, compare=False)

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

            with self.timer.measure():
                dist.all_reduce(tensor, group=self.group)
        return tensor

    def all_gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's `tensor` along its last dimension, in rank order."""
        if self.size == 1:
            return tensor
        import torch.distributed as dist

        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        with self.timer.measure():
            dist.all_gather(parts, tensor.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


SINGLE_PROCESS = ParallelContext()
