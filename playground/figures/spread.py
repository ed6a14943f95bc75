"""A reply's figure beside its configuration's spread: the running median and range of this session's replies on
the same configuration (keyed by its full label), so one reply's number is read against its noise.

Why: on a shared machine the same request gave TTFT 8 then 188 ms; a single figure cannot say whether a toggle
helped. Each reply shows the spread of the replies up to it, so earlier replies keep the spread they had.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

SPREAD_KEYS = ("engine_ttft_ms", "decode_tokens_per_s")


@dataclass(frozen=True)
class Spread:
    """Median, min and max of one figure over `count` replies."""

    median: float
    low: float
    high: float
    count: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values), len(values))

    def range_text(self, number: str, unit: str) -> str:
        """e.g. "median 40 ms, 8–188 ms", each value formatted by `number`."""
        low, high = number.format(self.low), number.format(self.high)
        return f"median {number.format(self.median)} {unit}, {low}–{high} {unit}"

    def text(self, number: str, unit: str) -> str:
        """e.g. "median 40 ms, 8–188 ms over 5 replies"."""
        return f"{self.range_text(number, unit)} over {self.count} replies"


def running_spreads(exchanges: list) -> list[dict[str, Spread]]:
    """For each exchange, the spread of each figure over the finished replies on its configuration up to it (none
    before a configuration has two)."""
    seen: dict[tuple[str, str], list[float]] = {}
    spreads = []
    for exchange in exchanges:
        mine = {}
        for key in SPREAD_KEYS:
            value = exchange.figures.get(key)
            values = seen.setdefault((exchange.config, key), [])
            if exchange.done and exchange.config and value is not None:
                values.append(value)
            if len(values) >= 2:
                mine[key] = Spread.of(values)
        spreads.append(mine)
    return spreads
