"""The block tables of running sequences as one int32 tensor, kept across steps and updated incrementally.

A plan lists each sequence's whole block table, but between two decode steps a table gains at
most one block. Rebuilding a padded [sequences, blocks] tensor from Python lists every step costs
time proportional to every cached block of every sequence; here each sequence keeps a row, and a
step writes only the entries that changed (one scatter for the whole step). A row whose table
changed other than by growing (the sequence was preempted and re-admitted into other blocks) is
rewritten. Rows of sequences absent from a step are released. Every tensor-parallel rank keeps
its own copy, maintained from the plans it receives.
"""

from __future__ import annotations

import torch

INITIAL_ROWS = 8


class BlockTables:
    """Rows of block ids per sequence id; `step_tables(chunks)` gives this step's [sequences, width] tensor."""

    def __init__(self, max_blocks_per_seq: int, device):
        self.device = device
        self.max_blocks = max_blocks_per_seq
        self.table = torch.zeros((INITIAL_ROWS, max_blocks_per_seq), dtype=torch.int32, device=device)
        self.rows: dict[int, int] = {}
        self.written: list[list[int]] = [[] for _ in range(INITIAL_ROWS)]
        self.free_rows = list(range(INITIAL_ROWS - 1, -1, -1))
        self.entries_written = 0  # by the last step: what incremental updating saves is visible (and tested)

    def _grow(self) -> None:
        old = self.table.shape[0]
        table = torch.zeros((2 * old, self.max_blocks), dtype=torch.int32, device=self.device)
        table[:old] = self.table
        self.table = table
        self.written.extend([] for _ in range(old))
        self.free_rows.extend(range(2 * old - 1, old - 1, -1))

    def _row(self, seq_id: int) -> int:
        row = self.rows.get(seq_id)
        if row is None:
            if not self.free_rows:
                self._grow()
            row = self.free_rows.pop()
            self.rows[seq_id] = row
            self.written[row] = []
        return row

    def step_tables(self, seq_ids: list[int | None], tables: list[list[int]], width: int) -> torch.Tensor:
        """[len(tables), width] int32: each sequence's blocks, written only where they changed (entries past
        a table's end are stale block ids that attention never reads)."""
        present = set()
        rows, update_rows, update_cols, update_values = [], [], [], []
        for seq_id, blocks in zip(seq_ids, tables, strict=True):
            if seq_id is None:  # a sequence without a name keeps its row for this step only
                seq_id = object()
            present.add(seq_id)
            row = self._row(seq_id)
            rows.append(row)
            written = self.written[row]
            first = len(written)
            if first > len(blocks) or blocks[:first] != written:
                first = 0
            if first < len(blocks):
                update_rows.extend([row] * (len(blocks) - first))
                update_cols.extend(range(first, len(blocks)))
                update_values.extend(blocks[first:])
            self.written[row] = list(blocks)  # a copy: the caller's list may grow in place
        self.entries_written = len(update_values)
        if update_values:
            self.table[torch.tensor(update_rows, device=self.device), torch.tensor(update_cols, device=self.device)] = \
                torch.tensor(update_values, dtype=torch.int32, device=self.device)
        self._release_absent(present)
        index = torch.tensor(rows, device=self.device)
        return self.table[:, :width].index_select(0, index)

    def _release_absent(self, present: set) -> None:
        for seq_id in [s for s in self.rows if s not in present]:
            self.free_rows.append(self.rows.pop(seq_id))
