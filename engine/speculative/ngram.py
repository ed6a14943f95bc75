"""Prompt lookup: propose what followed the last occurrence of the request's final n tokens.

No model runs: when an answer repeats its prompt (quoting, editing a passage, code that reuses
names) or itself, the tokens after an earlier match of the last n tokens are a good guess, and a
wrong guess costs only verification slots. Each request keeps an index from every n-gram of its
text to where its latest earlier occurrence ended, extended by the tokens added since the last
step, so a lookup costs O(n) whatever the text's length. Longer matches are tried first.
"""

from __future__ import annotations

from engine.core.request import Request

NGRAM_MAX = 4
NGRAM_MIN = 2


class NgramIndex:
    """Where the latest occurrence of each n-gram of one token sequence ended (its continuation starts)."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n = min_n
        self.max_n = max_n
        self.continuation: dict[tuple[int, ...], int] = {}
        self.indexed_ends = 0

    def extend(self, tokens: list[int]) -> None:
        """Index the n-grams ending before the last token (only those have a continuation)."""
        for end in range(self.indexed_ends, len(tokens) - 1):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                self.continuation[tuple(tokens[end + 1 - n:end + 1])] = end + 1
        self.indexed_ends = max(self.indexed_ends, len(tokens) - 1)

    def lookup(self, tokens: list[int], length: int) -> list[int]:
        """Up to `length` tokens that followed the longest earlier match of the sequence's suffix."""
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            start = self.continuation.get(tuple(tokens[len(tokens) - n:]))
            if start is not None:
                return tokens[start:start + length]
        return []


class NgramProposer:
    """Proposes by prompt lookup for every request that is ready to decode."""

    def __init__(self, min_n: int = NGRAM_MIN, max_n: int = NGRAM_MAX):
        self.min_n = min_n
        self.max_n = max_n
        self.indexes: dict[int, NgramIndex] = {}

    def propose(self, requests: list[Request], lengths: list[int]) -> tuple[list[list[int]], list[None]]:
        """Proposed tokens per request (at most its length), and their distributions: point masses."""
        proposals = []
        for request, length in zip(requests, lengths, strict=True):
            if length <= 0:
                proposals.append([])
                continue
            tokens = request.all_token_ids
            index = self.indexes.setdefault(request.request_id, NgramIndex(self.min_n, self.max_n))
            index.extend(tokens)
            proposals.append(index.lookup(tokens, length))
        return proposals, [None] * len(proposals)

    def rollback(self, request: Request, num_accepted: int) -> None:
        """Nothing to undo: the index only ever holds the request's own tokens."""

    def release(self, request: Request) -> None:
        self.indexes.pop(request.request_id, None)

    def close(self) -> None:
        self.indexes.clear()
