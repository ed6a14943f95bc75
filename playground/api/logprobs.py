"""`logprobs` / `top_logprobs` of the OpenAI routes: what a request asks for, and the engine's `TokenLogprob`s in
OpenAI's two formats.

Why here: the engine reports token ids and log-probabilities (of the raw logits, before temperature, as vLLM
reports them); a client wants each token's text and UTF-8 bytes, in the chat format
(`choices[].logprobs.content[]`: token, logprob, bytes, top_logprobs) or the completions one (`tokens`,
`token_logprobs`, `top_logprobs` dicts, `text_offset`). A token's bytes come from the tokenizer's own pieces
(byte-level BPE or SentencePiece byte tokens), so a token holding half of a UTF-8 character still has its exact
bytes; its text is those bytes decoded, with U+FFFD where a character is split.
"""

from __future__ import annotations

import re
import weakref

from playground.api.errors import APIError
from playground.shared.values import shown

SENTENCEPIECE_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the printable character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            characters[chr(byte)] = byte
        else:
            characters[chr(256 + extra)] = byte
            extra += 1
    return characters


BYTE_LEVEL = _byte_level_alphabet()


class TokenBytes:
    """Each token id's exact bytes under one tokenizer (computed once per id)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._bytes: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        found = self._bytes.get(token_id)
        if found is None:
            found = self._bytes[token_id] = self._compute(token_id)
        return found

    def _compute(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str) and piece:
            if token_id not in self.tokenizer.all_special_ids and all(c in BYTE_LEVEL for c in piece):
                return bytes(BYTE_LEVEL[c] for c in piece)
            match = SENTENCEPIECE_BYTE.match(piece)
            if match:
                return bytes([int(match.group(1), 16)])
            if piece.startswith("▁"):
                return (" " + piece[1:]).encode()
        return self.tokenizer.decode([token_id]).encode()


_PER_TOKENIZER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_bytes(tokenizer) -> TokenBytes:
    """The shared TokenBytes of `tokenizer`."""
    found = _PER_TOKENIZER.get(tokenizer)
    if found is None:
        found = _PER_TOKENIZER[tokenizer] = TokenBytes(tokenizer)
    return found


def parse_logprobs(body: dict, kind: str, cap: int) -> int | None:
    """How many alternatives per token the request asks for (None: no logprobs), at most `cap`.

    Chat: `logprobs` true/false and `top_logprobs` 0..cap (which needs `logprobs: true`, as OpenAI requires);
    completions: `logprobs` 0..cap.
    """
    asked = body.get("logprobs")
    if kind == "text":
        if asked is None:
            return None
        return _count("logprobs", asked, cap)
    if asked is not None and not isinstance(asked, bool):
        raise APIError(400, "logprobs must be true or false", param="logprobs")
    top = body.get("top_logprobs")
    if top is not None and not asked:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    if not asked:
        return None
    return 0 if top is None else _count("top_logprobs", top, cap)


def _count(name: str, value, cap: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= cap:
        raise APIError(400, f"{name} must be an integer from 0 to {cap} on this server, got {shown(value)}",
                       param=name)
    return value


def chat_logprobs(entries: list, to_bytes: TokenBytes) -> dict:
    """The chat format of these TokenLogprobs: `{"content": [...], "refusal": None}`."""
    def item(token_id: int, logprob: float) -> dict:
        raw = to_bytes(token_id)
        return {"token": raw.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(raw)}

    return {"content": [{**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                        for e in entries], "refusal": None}


def text_logprobs(entries: list, to_bytes: TokenBytes, offset: int = 0) -> dict:
    """The completions format of these TokenLogprobs; `offset`: characters of the completion before them (a
    streamed chunk's offsets continue the reply's). Each `top_logprobs` dict holds the chosen token too, as
    OpenAI's does."""
    tokens, offsets = [], []
    for entry in entries:
        offsets.append(offset)
        tokens.append(to_bytes(entry.token_id).decode("utf-8", "replace"))
        offset += len(tokens[-1])
    tops = [{**{to_bytes(t).decode("utf-8", "replace"): lp for t, lp in e.top}, token: e.logprob}
            for e, token in zip(entries, tokens, strict=True)]
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": tops,
            "text_offset": offsets}
