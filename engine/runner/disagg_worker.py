"""One worker of a disaggregated engine: a whole model and its own KV pool, running prompt chunks or decode steps.

`DisaggregatedBackend` (backends/disaggregated.py) starts two of these through a `WorkerGang`
(heartbeats, fatal errors and clean exit are `worker_process.py`'s): rank 0 is the prefill
worker, rank 1 the decode worker. Both take commands from the engine over their own pipe and
answer every command, in order:
- (STEP, plan): execute the plan on this worker's model and pool, answer ("logits", rows, counters);
- (SEND_KV, (transfer_id, blocks)) on the prefill worker: copy those blocks' K and V out of the
  pool into one buffer and start a `torch.distributed.isend` of it to the decode worker (tag =
  transfer id) over the gang's gloo group; answer ("kv_sent", transfer_id, bytes, seconds) at once.
  The copy is taken before the answer, so the engine may hand the blocks to another prompt right
  away, and the prefill worker never waits for the decode worker to take the bytes;
- (RECV_KV, (transfer_id, blocks)) on the decode worker: receive the buffer and write it into those
  blocks of its pool; answer ("kv_received", transfer_id, bytes, seconds).
Commands on one pipe run in order, which is what makes the engine's bookkeeping safe: a block freed
by the engine can only be written again by a later command, after the one that used it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.core.metrics import peak_memory_bytes
from engine.quant.storage import weight_storage_bytes
from engine.runner.build import RunnerSettings, build_runner
from engine.runner.worker_process import STEP, STOP, join_default_group, run_worker_process

SEND_KV, RECV_KV = "send_kv", "recv_kv"
PREFILL_RANK, DECODE_RANK = 0, 1


@dataclass(frozen=True)
class DisaggWorkerSpec:
    """Which worker this is (0 = prefill, 1 = decode) and where to meet its peer."""

    rank: int
    store_port: int
    threads: int
    parent_pid: int
    settings: RunnerSettings


def block_slots(blocks: list[int], block_size: int, device) -> torch.Tensor:
    """The pool slots of `blocks`, in order."""
    ids = torch.tensor(blocks, dtype=torch.long, device=device)
    return (ids[:, None] * block_size + torch.arange(block_size, device=device)).reshape(-1)


class DisaggWorker:
    """Joins the two-worker gloo group, builds a whole model and pool, then serves commands until told to stop."""

    def __init__(self, spec: DisaggWorkerSpec, command, counters: dict):
        self.rank = spec.rank
        self.command = command
        self.counters = counters
        counters.update(execute_seconds=0.0, transfer_seconds=0.0, steps=0, prefill_chunks=0, decode_rows=0,
                        peak_memory_bytes=0)
        self.cuda = spec.settings.device == "cuda"
        torch.set_num_threads(spec.threads)
        if self.cuda:
            torch.cuda.set_device(spec.rank % max(1, torch.cuda.device_count()))
        join_default_group(spec.store_port, spec.rank, 2)
        self.runner = build_runner(spec.settings)
        self.device = self.runner.device
        self.head_major = spec.settings.attention != "flash-attn"  # as build_runner lays the pool out
        self.pending_sends: list = []  # (work, buffer) of transfers the decode worker has not taken yet

    def describe(self) -> dict:
        return {"weights_bytes": weight_storage_bytes(self.runner.model), "kv_cache_bytes": self.runner.kv_cache.nbytes,
                "threads": torch.get_num_threads()}

    def _slot_dim(self) -> int:
        """Where the slots are: [2, layers, kv_heads, slots, row] head-major, else [2, layers, slots, kv_heads, row]."""
        return 3 if self.head_major else 2

    def _send(self, transfer_id: int, blocks: list[int]) -> tuple[int, float]:
        started = time.perf_counter()
        storage = self.runner.kv_cache.storage
        buffer = storage.index_select(self._slot_dim(), block_slots(blocks, self.runner.block_size, self.device))
        if self.cuda:  # gloo sends from host memory
            buffer = buffer.cpu()
        buffer = buffer.contiguous()
        self.pending_sends.append((dist.isend(buffer, dst=DECODE_RANK, tag=transfer_id), buffer))
        self.pending_sends = [(work, kept) for work, kept in self.pending_sends if not work.is_completed()]
        return buffer.numel() * buffer.element_size(), time.perf_counter() - started

    def _receive(self, transfer_id: int, blocks: list[int]) -> tuple[int, float]:
        started = time.perf_counter()
        storage = self.runner.kv_cache.storage
        dim = self._slot_dim()
        shape = list(storage.shape)
        shape[dim] = len(blocks) * self.runner.block_size
        buffer = torch.empty(shape, dtype=storage.dtype)
        dist.recv(buffer, src=PREFILL_RANK, tag=transfer_id)
        storage.index_copy_(dim, block_slots(blocks, self.runner.block_size, self.device), buffer.to(self.device))
        return buffer.numel() * buffer.element_size(), time.perf_counter() - started

    def serve(self) -> None:
        while True:
            kind, body = self.command.recv()
            if kind == STOP:
                break
            started = time.perf_counter()
            if kind == STEP:
                logits = self.runner.execute(body)
                if self.cuda:
                    torch.cuda.synchronize()
                rows = logits.cpu().numpy()
                self.counters.update(
                    execute_seconds=self.counters["execute_seconds"] + time.perf_counter() - started,
                    steps=self.counters["steps"] + 1,
                    prefill_chunks=self.counters["prefill_chunks"] + sum(len(c.token_ids) > 1 for c in body.chunks),
                    decode_rows=self.counters["decode_rows"] + sum(len(c.token_ids) == 1 for c in body.chunks),
                    peak_memory_bytes=peak_memory_bytes(self.device))
                self.command.send(("logits", rows, dict(self.counters)))
            else:
                transfer_id, blocks = body
                nbytes, seconds = (self._send if kind == SEND_KV else self._receive)(transfer_id, blocks)
                self.counters["transfer_seconds"] += seconds
                self.command.send(("kv_sent" if kind == SEND_KV else "kv_received", transfer_id, nbytes, seconds,
                                   dict(self.counters)))
        for work, _ in self.pending_sends:
            work.wait()


def run_disagg_worker(spec: DisaggWorkerSpec, command, status) -> None:
    """The worker process's entry point (spawned)."""
    run_worker_process(DisaggWorker, spec, command, status)
