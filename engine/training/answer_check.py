"""The mechanical check of an answer: does it open with the documentation's first sentence?

The card's recall figures come from here, so the rule is fixed and plain: the answer's first
sentence and the reference's first sentence are compared word by word (case, backticks and
punctuation ignored), and they match when difflib's similarity ratio is at least
CLOSE_RATIO, which allows a dropped or changed word or two, not a different sentence.
Repetition is a separate check: some run of four words that occurs more often in the answer than
in the reference it is graded against (documentation that itself says "the number of items" twice
may be quoted word for word; a loop may not).
"""

from __future__ import annotations

import difflib
import re
from collections import Counter

CLOSE_RATIO = 0.8
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)|\n\s*\n")


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_]+", text.lower())


def first_sentence(text: str) -> str:
    """Up to the first sentence end followed by more text, or the first paragraph break."""
    return SENTENCE_END.split(text.strip(), maxsplit=1)[0]


def opening_similarity(answer: str, reference: str) -> float:
    """difflib ratio of the two first sentences' word lists (1.0 = the same words in order)."""
    got, expected = words(first_sentence(answer)), words(first_sentence(reference))
    return difflib.SequenceMatcher(None, got, expected, autojunk=False).ratio()


def opens_with_reference(answer: str, reference: str) -> bool:
    """True when `answer` opens with `reference`'s first sentence or a close restatement of it."""
    return opening_similarity(answer, reference) >= CLOSE_RATIO


def four_word_runs(text: str) -> Counter[tuple[str, ...]]:
    """How often each run of four consecutive words occurs in `text`."""
    tokens = words(text)
    return Counter(tuple(tokens[i: i + 4]) for i in range(len(tokens) - 3))


def repeats_four_words(text: str, reference: str = "") -> bool:
    """True when some run of four consecutive words occurs at least twice in `text`, and more often than in
    `reference` (an answer quoting its documentation's own repetition does not loop)."""
    allowed = four_word_runs(reference)
    return any(count > 1 and count > allowed[run] for run, count in four_word_runs(text).items())
