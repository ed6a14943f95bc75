"""Executing a `StepPlan` on the native model: tensors in, logits out.

All of a step's new tokens form one flat batch, so the linear layers (most of the FLOPs) run as
one matmul over every sequence. The attention metadata is built once per step and shared by all
layers. Logits are computed only at the positions the plan scores (a chunk in the middle of a
prompt needs none), which skips the LM head for most prefill tokens. Sampling is not done here:
on a tensor-parallel setup every rank executes the same plan, and only the engine samples.
"""

from __future__ import annotations

import torch

from engine.model.attention import AttentionMetadata, PrefillSpan, causal_mask_with_offset
from engine.model.llama import LlamaForCausalLM
from engine.runner.cuda_graphs import DecodeGraphs
from engine.runner.kv_cache import KVCache
from engine.runner.step_plan import StepPlan


class ModelRunner:
    """Runs one step of the native model over the KV pool and returns the scored positions' logits."""

    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, device: str, attention_name: str,
                 decode_graphs: DecodeGraphs | None = None):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.device = device
        self.flash = attention_name == "flash-attn"
        self.decode_graphs = decode_graphs

    def _tensor(self, values, dtype=torch.long) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def prepare(self, plan: StepPlan):
        """Flat input ids, positions, attention metadata and the token rows whose logits are needed."""
        input_ids: list[int] = []
        positions: list[int] = []
        decode_rows, kv_lens, query_lens = [], [], []
        spans: list[tuple[int, int, int]] = []
        logit_rows: list[int] = []
        for row, chunk in enumerate(plan.chunks):
            token_start = len(input_ids)
            input_ids.extend(chunk.token_ids)
            positions.extend(range(chunk.start, chunk.end))
            kv_lens.append(chunk.end)
            query_lens.append(len(chunk.token_ids))
            if len(chunk.token_ids) == 1:
                decode_rows.append(row)
            else:
                spans.append((row, token_start, chunk.start))
            logit_rows.extend(range(len(input_ids) - chunk.num_logits, len(input_ids)))
        max_blocks = max(len(chunk.block_table) for chunk in plan.chunks)
        tables = self._tensor([chunk.block_table + [0] * (max_blocks - len(chunk.block_table))
                               for chunk in plan.chunks])
        position_tensor = self._tensor(positions)
        row_of_token = torch.repeat_interleave(torch.arange(len(plan.chunks), device=self.device),
                                               self._tensor(query_lens))
        slots = (tables[row_of_token, position_tensor // self.block_size] * self.block_size
                 + position_tensor % self.block_size)
        meta = AttentionMetadata(slot_mapping=slots)
        if self.flash:
            meta.flash = self._flash_metadata(tables, query_lens, kv_lens, not spans)
        else:
            self._fill_paged_metadata(meta, tables, decode_rows, kv_lens, query_lens, spans)
        return self._tensor(input_ids), position_tensor, meta, self._tensor(logit_rows)

    def _fill_paged_metadata(self, meta, tables, decode_rows, kv_lens, query_lens, spans) -> None:
        token_starts = [0]
        for length in query_lens:
            token_starts.append(token_starts[-1] + length)
        if decode_rows:
            rows = self._tensor(decode_rows)
            lens = self._tensor([kv_lens[r] for r in decode_rows])
            width = -(-max(kv_lens[r] for r in decode_rows) // self.block_size)
            meta.decode_blocks = tables[rows, :width].flatten()
            kv_positions = torch.arange(width * self.block_size, device=self.device)
            meta.decode_mask = (kv_positions[None, :] < lens[:, None])[:, None, None, :]
            meta.decode_token_index = self._tensor([token_starts[r] for r in decode_rows])
        for row, token_start, start in spans:
            count, kv_len = query_lens[row], kv_lens[row]
            if start == 0:
                meta.prefills.append(PrefillSpan(token_start, token_start + count, kv_len, None, None))
                continue
            blocks = tables[row, :-(-kv_len // self.block_size)]
            mask = causal_mask_with_offset(count, kv_len, self.device)
            meta.prefills.append(PrefillSpan(token_start, token_start + count, kv_len, blocks, mask))

    def _flash_metadata(self, tables, query_lens, kv_lens, decode_only) -> dict:
        cu_q = torch.zeros(len(query_lens) + 1, dtype=torch.int32, device=self.device)
        cu_k = torch.zeros_like(cu_q)
        cu_q[1:] = torch.cumsum(self._tensor(query_lens, torch.int32), 0)
        cu_k[1:] = torch.cumsum(self._tensor(kv_lens, torch.int32), 0)
        return {"decode_only": decode_only, "block_table": tables.to(torch.int32),
                "seqlens_k": self._tensor(kv_lens, torch.int32), "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
                "max_seqlen_q": max(query_lens), "max_seqlen_k": max(kv_lens)}

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> torch.Tensor:
        """float32 logits [plan.num_logits, vocab] of the scored positions, in plan order."""
        input_ids, positions, meta, logit_rows = self.prepare(plan)
        graphs = self.decode_graphs
        if graphs is not None and meta.flash["decode_only"] and graphs.fits(len(plan.chunks)):
            hidden = graphs.run(input_ids, positions, meta.slot_mapping, meta.flash["seqlens_k"],
                                meta.flash["block_table"])
        else:
            hidden = self.model(input_ids, positions, self.kv_cache.layers, meta)
        return self.model.compute_logits(hidden.index_select(0, logit_rows))

    def close(self) -> None:
        """Drop the model, the KV pool and captured graphs (their memory goes with the last reference)."""
        self.model = None
        self.kv_cache = None
        self.decode_graphs = None
