"""CUDA graphs for decode steps: replay a captured forward pass instead of launching ~10 kernels per layer.

A decode step of a small model on a GPU is dominated by kernel-launch overhead, not math. Its
shapes depend only on the batch size, so (as vLLM and nano-vllm do) the forward pass is captured
once per batch-size bucket over static input buffers, and each step copies its inputs into the
buffers and replays the graph. Only pure-decode steps with the flash-attn backend qualify: its
paged decode kernel takes fixed-shape block tables, while the sdpa path gathers a
length-dependent amount of KV. Rows padding a batch up to its bucket write their K/V into a
scratch block that no sequence owns.
"""

from __future__ import annotations

import torch

from engine.model.attention import AttentionMetadata


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 16 up to max_batch."""
    buckets = [b for b in (1, 2, 4, 8) if b < max_batch]
    buckets += list(range(16, max_batch, 16)) + [max_batch]
    return sorted(set(buckets))


class DecodeGraphs:
    """Captured decode forward passes, one per batch-size bucket, sharing one memory pool."""

    def __init__(self, model, kv_layers, max_batch: int, max_blocks_per_seq: int, scratch_block: int,
                 block_size: int, device: str):
        self.model = model
        self.kv_layers = kv_layers
        self.buckets = batch_buckets(max_batch)
        self.scratch_slot = scratch_block * block_size
        self.scratch_block = scratch_block
        self.input_ids = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_batch,), self.scratch_slot, dtype=torch.long, device=device)
        self.seqlens = torch.ones(max_batch, dtype=torch.int32, device=device)
        self.block_table = torch.full((max_batch, max_blocks_per_seq), scratch_block, dtype=torch.int32,
                                      device=device)
        self.outputs: dict[int, torch.Tensor] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._capture_all()

    def _meta(self, batch: int) -> AttentionMetadata:
        return AttentionMetadata(slot_mapping=self.slot_mapping[:batch], flash={
            "decode_only": True, "block_table": self.block_table[:batch], "seqlens_k": self.seqlens[:batch]})

    def _forward(self, batch: int) -> torch.Tensor:
        return self.model(self.input_ids[:batch], self.positions[:batch], self.kv_layers, self._meta(batch))

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        for batch in reversed(self.buckets):
            self._forward(batch)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[batch] = self._forward(batch)
            pool = graph.pool()
            self.graphs[batch] = graph
        torch.cuda.synchronize()

    def fits(self, batch: int) -> bool:
        return batch <= self.buckets[-1]

    @torch.inference_mode()
    def run(self, input_ids, positions, slot_mapping, seqlens, block_table) -> torch.Tensor:
        """Final hidden states [batch, hidden] of one decode step, by graph replay."""
        batch = input_ids.shape[0]
        bucket = next(b for b in self.buckets if b >= batch)
        self.input_ids[:batch] = input_ids
        self.positions[:batch] = positions
        self.slot_mapping[:batch] = slot_mapping
        self.slot_mapping[batch:bucket] = self.scratch_slot
        self.seqlens[:batch] = seqlens
        self.seqlens[batch:bucket] = 1
        self.block_table[:batch].fill_(self.scratch_block)
        self.block_table[:batch, :block_table.shape[1]] = block_table
        self.block_table[batch:bucket] = self.scratch_block
        self.graphs[bucket].replay()
        return self.outputs[bucket][:batch]
