"""Executing a `StepPlan` on the native model: tensors in, logits out.

All of a step's new tokens form one flat batch, so the linear layers (most of the FLOPs) run as
one matmul over every sequence; a decode step of a few sequences runs its decoder layers in one
kernel call where the model allows it (model/fused_decode.py). The step is described once
(`StepBatch`: positions, slots, block tables, lengths), built with tensor operations from the
plan's lists and from block tables kept across steps (`BlockTables`), and each attention backend
derives what its layers read from it. Logits are computed only at the positions the plan scores
(a chunk in the middle of a prompt needs none), which skips the LM head for most prefill tokens.
Sampling is not done here: on a tensor-parallel setup every rank executes the same plan, and only
the engine samples.
"""

from __future__ import annotations

from itertools import chain

import torch

from engine.core.step_timing import section
from engine.model.attention import StepBatch
from engine.model.fused_decode import FusedDecode, supports_fused_decode
from engine.model.llama import LlamaForCausalLM
from engine.model.matmul import SMALL_BATCH_MAX_ROWS
from engine.runner.block_tables import BlockTables
from engine.runner.cuda_graphs import DecodeGraphs
from engine.runner.kv_cache import KVCache
from engine.runner.step_plan import SequenceChunk, StepPlan


class ModelRunner:
    """Runs one step of the native model over the KV pool and returns the scored positions' logits."""

    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, device: str, attention, max_model_len: int,
                 decode_graphs: DecodeGraphs | None = None):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.device = device
        self.attention = attention
        self.decode_graphs = decode_graphs
        self.block_tables = BlockTables(-(-max_model_len // self.block_size), device)
        self.fused_decode = FusedDecode(model) if supports_fused_decode(model) else None

    def _tensor(self, values, dtype=torch.long) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def prepare(self, plan: StepPlan):
        """Flat input ids, positions, attention metadata, and the token rows whose logits are needed
        (None when every token is scored in order, as in a decode step)."""
        chunks = plan.chunks
        query_lens = [len(chunk.token_ids) for chunk in chunks]
        starts = [chunk.start for chunk in chunks]
        num_logits = [chunk.num_logits for chunk in chunks]
        input_ids = self._tensor(list(chain.from_iterable(chunk.token_ids for chunk in chunks)))
        width = -(-max(s + n for s, n in zip(starts, query_lens, strict=True)) // self.block_size)
        tables = self.block_tables.step_tables([chunk.seq_id for chunk in chunks],
                                               [chunk.block_table for chunk in chunks], width)
        start = self._tensor(starts)
        num_tokens = input_ids.shape[0]
        if num_tokens == len(chunks):  # one token per sequence: the common decode step
            query_len = torch.ones_like(start)
            query_start = torch.arange(num_tokens, device=self.device)
            positions = start
            table_rows = tables
        else:
            query_len = self._tensor(query_lens)
            query_start = torch.cumsum(query_len, 0) - query_len
            row_of_token = torch.repeat_interleave(torch.arange(len(chunks), device=self.device), query_len,
                                                   output_size=num_tokens)
            positions = start[row_of_token] + torch.arange(num_tokens, device=self.device) - query_start[row_of_token]
            table_rows = tables.index_select(0, row_of_token)
        block_index = torch.div(positions, self.block_size, rounding_mode="floor")
        slots = table_rows.gather(1, block_index.unsqueeze(1)).squeeze(1).long() * self.block_size \
            + positions % self.block_size
        batch = StepBatch(slot_mapping=slots, block_tables=tables, query_start=query_start, query_len=query_len,
                          context_lens=start + query_len, query_lens=query_lens, starts=starts)
        meta = self.attention.build_metadata(batch)
        return input_ids, positions, meta, self._logit_rows(query_start + query_len, num_logits, num_tokens)

    def _logit_rows(self, ends: torch.Tensor, num_logits: list[int], num_tokens: int) -> torch.Tensor | None:
        """Flat indices of each sequence's last `num_logits` tokens, in plan order."""
        total = sum(num_logits)
        if total == num_tokens:
            return None
        counts = self._tensor(num_logits)
        first = torch.repeat_interleave(ends - counts, counts, output_size=total)
        offsets = torch.arange(total, device=self.device) - torch.repeat_interleave(
            torch.cumsum(counts, 0) - counts, counts, output_size=total)
        return first + offsets

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> torch.Tensor:
        """float32 logits [plan.num_logits, vocab] of the scored positions, in plan order."""
        with section("prepare"):
            input_ids, positions, meta, logit_rows = self.prepare(plan)
        graphs = self.decode_graphs
        if graphs is not None and meta.flash["decode_only"] and graphs.fits(len(plan.chunks)):
            hidden = graphs.run(input_ids, positions, meta.slot_mapping, meta.flash["seqlens_k"],
                                meta.flash["block_table"])
        elif self.fused_decode is not None and self.fused_decode.applies(meta.batch):
            with section("fused_layers"):
                hidden = self.fused_decode(input_ids, positions, self.kv_cache.layers, meta.batch)
        else:
            hidden = self.model(input_ids, positions, self.kv_cache.layers, meta)
        with section("lm_head"):
            if logit_rows is not None:
                hidden = hidden.index_select(0, logit_rows)
            return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def greedy_proposals(self, chunks: list[SequenceChunk], steps: list[int],
                         vocab_limit: int) -> list[list[int]] | None:
        """Greedy continuations for a draft model: each chunk is computed (the tokens its sequence has not seen,
        newest last) and sequence n's next `steps[n]` tokens follow, each fed back as the next input, every step
        in one kernel call; None where this model or step does not take that path (the caller then loops over
        `execute`). Positions up to each chunk's end + steps - 2 must have KV slots in its block table."""
        fused = self.fused_decode
        if (fused is None or not fused.proposes_greedily or min(steps, default=0) < 1
                or sum(len(chunk.token_ids) for chunk in chunks) > SMALL_BATCH_MAX_ROWS):
            return None
        width = max(-(-(chunk.end + count - 1) // self.block_size) for chunk, count in zip(chunks, steps, strict=True))
        tables = self.block_tables.step_tables([chunk.seq_id for chunk in chunks],
                                               [chunk.block_table for chunk in chunks], width)
        positions = [position for chunk in chunks for position in range(chunk.start, chunk.end)]
        with section("fused_layers"):
            proposed = fused.greedy_proposals(
                self._tensor(list(chain.from_iterable(chunk.token_ids for chunk in chunks))), self._tensor(positions),
                self._tensor([len(chunk.token_ids) for chunk in chunks]), self._tensor(steps), tables,
                self.kv_cache.layers, vocab_limit)
        return [[token for token in row if token >= 0] for row in proposed.tolist()]

    def close(self) -> None:
        """Drop the model, the KV pool and captured graphs (their memory goes with the last reference)."""
        self.model = None
        self.kv_cache = None
        self.decode_graphs = None
