"""Token-id prompts for tests that must control what the prefix cache can share."""

from __future__ import annotations

from tests.support.tiny_models import VOCAB


def distinct_prompts(count: int, length: int, first: int = 0) -> list[list[int]]:
    """`count` token-id prompts whose first tokens all differ, so no two share a cached prefix block."""
    return [[3 + ((first + index) * 37 + offset) % (VOCAB - 3) for offset in range(length)]
            for index in range(count)]
