"""Turning a scheduled batch into tensors, running the model once, and sampling.

All of a step's new tokens form one flat batch, so the linear layers (most of the FLOPs) run as
a single matmul over every sequence. The attention metadata is built once per step, shared by
all layers. Logits are computed only at the last position of sequences that complete this step
(a chunk in the middle of a prompt needs none), which skips the LM head for most prefill tokens.
"""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata, PrefillSpan, causal_mask_with_offset
from engine.block_manager import BlockManager
from engine.cuda_graphs import DecodeGraphs
from engine.kv_cache import KVCache
from engine.model import LlamaFamilyModel
from engine.sampling import sample
from engine.scheduler import ScheduledRequest


class ModelRunner:
    """Runs one engine step on the native model and returns the sampled tokens."""

    def __init__(self, model: LlamaFamilyModel, kv_cache: KVCache, block_manager: BlockManager,
                 device: str, attention_name: str, decode_graphs: DecodeGraphs | None = None):
        self.model = model
        self.kv_cache = kv_cache
        self.block_manager = block_manager
        self.block_size = block_manager.block_size
        self.device = device
        self.flash = attention_name == "flash-attn"
        self.decode_graphs = decode_graphs

    def _tensor(self, values, dtype=torch.long) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def _slots(self, tables: torch.Tensor, rows, positions: torch.Tensor) -> torch.Tensor:
        """Cache slot of each (sequence row, token position): its block id * block_size + offset."""
        return tables[rows, positions // self.block_size] * self.block_size + positions % self.block_size

    def prepare(self, scheduled: list[ScheduledRequest]):
        """Flat input ids, positions, attention metadata and the rows whose logits are needed."""
        input_ids: list[int] = []
        positions: list[int] = []
        tables = []
        decode_rows, kv_lens, query_lens = [], [], []
        spans: list[tuple[int, int, int]] = []
        logit_rows: list[int] = []
        for item in scheduled:
            request, count = item.request, item.num_new_tokens
            start = request.num_computed_tokens
            token_start = len(input_ids)
            input_ids.extend(request.all_token_ids[start:start + count])
            positions.extend(range(start, start + count))
            tables.append(self.block_manager.block_table(request.request_id))
            kv_lens.append(start + count)
            query_lens.append(count)
            if count == 1:
                decode_rows.append(len(tables) - 1)
            else:
                spans.append((len(tables) - 1, token_start, start))
            if item.completes_sequence:
                logit_rows.append(len(input_ids) - 1)
        max_blocks = max(len(t) for t in tables)
        table_tensor = self._tensor([t + [0] * (max_blocks - len(t)) for t in tables])
        position_tensor = self._tensor(positions)
        row_of_token = torch.repeat_interleave(torch.arange(len(tables), device=self.device),
                                               self._tensor(query_lens))
        meta = AttentionMetadata(slot_mapping=self._slots(table_tensor, row_of_token, position_tensor))
        if self.flash:
            meta.flash = self._flash_metadata(table_tensor, query_lens, kv_lens, not spans)
        else:
            self._fill_paged_metadata(meta, table_tensor, decode_rows, kv_lens, query_lens, spans)
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
    def execute(self, scheduled: list[ScheduledRequest]) -> list[int]:
        """Run the step; return one sampled token per request that completes its sequence, in order."""
        input_ids, positions, meta, logit_rows = self.prepare(scheduled)
        graphs = self.decode_graphs
        if graphs is not None and meta.flash["decode_only"] and graphs.fits(len(scheduled)):
            hidden = graphs.run(input_ids, positions, meta.slot_mapping, meta.flash["seqlens_k"],
                                meta.flash["block_table"])
        else:
            hidden = self.model(input_ids, positions, self.kv_cache.layers, meta)
        completing = [item.request for item in scheduled if item.completes_sequence]
        if not completing:
            return []
        logits = self.model.compute_logits(hidden.index_select(0, logit_rows))
        return sample(logits, [r.params for r in completing], [r.generator for r in completing])
