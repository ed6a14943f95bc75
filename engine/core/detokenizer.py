"""Incremental detokenization and stop-string handling for streamed output.

Decoding the whole output after every token is quadratic and makes deltas jump when a
multi-byte character spans tokens. Instead each step decodes only a short window (the idea of
vLLM's `detokenize_incrementally`): the text of `ids[prefix:]` minus the text of
`ids[prefix:read]`, and holds the delta back while it ends in an incomplete character.
Text that could still turn out to be the start of a stop string (a suffix that is a prefix of
one) is held back too, and nothing else, so the concatenated stream always equals the final text
and a long stop string does not delay text that cannot begin it.
"""

from __future__ import annotations

_PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas, honouring stop strings."""

    def __init__(self, tokenizer, prompt_ids: list[int], stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        context = list(prompt_ids[-_PROMPT_CONTEXT_TOKENS:]) if tokenizer is not None else []
        self.ids = context
        self.prefix_offset = 0
        self.read_offset = len(context)
        self.stop = stop
        self.longest_stop = max((len(s) for s in stop), default=0)
        self.text = ""
        self.emitted = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _advance(self, final: bool) -> None:
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        if len(new_text) > len(prefix_text) and (final or not new_text.endswith("\ufffd")):
            self.text += new_text[len(prefix_text):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)

    def _stop_prefix_length(self) -> int:
        """Length of the longest suffix of the text that some stop string starts with."""
        longest = 0
        for stop in self.stop:
            for length in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:length]):
                    longest = length
                    break
        return longest

    def add(self, new_ids: list[int], final: bool = False) -> tuple[str, bool]:
        """Append tokens; return (text delta safe to show, whether a stop string was hit)."""
        if self.tokenizer is None:
            return "", False
        searched_from = max(0, len(self.text) - self.longest_stop + 1)
        self.ids.extend(new_ids)
        self._advance(final)
        stopped = False
        for stop in self.stop:
            index = self.text.find(stop, searched_from)
            if index != -1:
                self.text = self.text[:index]
                stopped = True
                searched_from = min(searched_from, index)
        held = 0 if (final or stopped) else self._stop_prefix_length()
        visible = max(self.emitted, len(self.text) - held)
        delta = self.text[self.emitted:visible]
        self.emitted = visible
        return delta, stopped

    def flush(self) -> str:
        """The rest of the text once the request is finished."""
        if self.tokenizer is None:
            return ""
        delta, _ = self.add([], final=True)
        return delta
