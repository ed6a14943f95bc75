"""The tokenizer of a checkpoint as GGUF metadata, for llama.cpp's own tokenizer.

Why: the engine always tokenizes prompts itself and hands llama.cpp token ids, so serving never depends on this; but
a GGUF file that carries its tokenizer is a complete model anyone can run, and the test that llama.cpp tokenizes the
same way the engine does checks the conversion. Only the tokenizer llama.cpp reproduces exactly is described:
byte-level BPE over GPT-2's pre-tokenizer regex (`tokenizer.ggml.model` "gpt2", pre-tokenizer "gpt-2"), with no
normalizer. Any other tokenizer (SentencePiece, digit-splitting pre-tokenizers, ...) is written as "none" with the
vocabulary's size only: llama.cpp then has placeholder tokens, and the engine's tokenizer stays the only one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PRE_TOKENIZER = "gpt-2"  # llama.cpp's name for GPT-2's regex
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5  # llama.cpp's token types


@dataclass(frozen=True)
class GGUFVocab:
    """What the GGUF says of the tokenizer: `model` "gpt2" with its tokens, or "none" (tokens empty)."""

    model: str
    size: int
    tokens: tuple[str, ...] = ()
    token_types: tuple[int, ...] = ()
    merges: tuple[str, ...] = ()
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = None

    @property
    def described(self) -> bool:
        """Whether llama.cpp gets the real tokenizer (else placeholder tokens)."""
        return self.model == "gpt2"


def is_gpt2_byte_level(spec: dict) -> bool:
    """Whether a tokenizer.json is byte-level BPE over GPT-2's regex alone, which llama.cpp's "gpt2" reproduces."""
    pre = spec.get("pre_tokenizer") or {}
    model = spec.get("model") or {}
    return (spec.get("normalizer") is None and pre.get("type") == "ByteLevel" and pre.get("use_regex", True)
            and not pre.get("add_prefix_space", False) and model.get("type") == "BPE"
            and not model.get("byte_fallback", False) and model.get("continuing_subword_prefix") is None
            and model.get("end_of_word_suffix") is None)


def describes_tokenizer(path: Path) -> bool:
    """Whether the GGUF of the checkpoint in `path` carries its tokenizer (else "none")."""
    spec_file = path / "tokenizer.json"
    return spec_file.is_file() and is_gpt2_byte_level(json.loads(spec_file.read_text(encoding="utf-8")))


def read_vocab(path: Path, vocab_size: int, tokenizer) -> GGUFVocab:
    """The GGUF vocabulary of the checkpoint in `path` with its loaded `tokenizer` (None: the folder has none), padded
    to the model's `vocab_size` rows with unused placeholder tokens."""
    spec_file = path / "tokenizer.json"
    if tokenizer is None or not spec_file.is_file():
        return GGUFVocab("none", vocab_size)
    spec = json.loads(spec_file.read_text(encoding="utf-8"))
    if not is_gpt2_byte_level(spec):
        return GGUFVocab("none", vocab_size)
    by_id = {index: token for token, index in spec["model"]["vocab"].items()}
    types = dict.fromkeys(by_id, TOKEN_NORMAL)
    for added in spec.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
        types[added["id"]] = TOKEN_CONTROL if added.get("special") else TOKEN_USER_DEFINED
    size = max(vocab_size, max(by_id) + 1)
    tokens = tuple(by_id.get(index, f"[PAD{index}]") for index in range(size))
    token_types = tuple(types.get(index, TOKEN_UNUSED) for index in range(size))
    merges = tuple(merge if isinstance(merge, str) else " ".join(merge) for merge in spec["model"].get("merges", []))
    framed = tokenizer.encode("x", add_special_tokens=True)
    bos = tokenizer.bos_token_id
    return GGUFVocab("gpt2", size, tokens, token_types, merges, bos, tokenizer.eos_token_id, tokenizer.pad_token_id,
                     add_bos=bos is not None and framed[:1] == [bos],
                     chat_template=getattr(tokenizer, "chat_template", None) or None)


def write_vocab(writer, vocab: GGUFVocab) -> None:
    """Add the vocabulary's keys to a `gguf.GGUFWriter`."""
    writer.add_tokenizer_model(vocab.model)
    writer.add_vocab_size(vocab.size)
    if not vocab.described:
        return
    writer.add_tokenizer_pre(PRE_TOKENIZER)
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_types(list(vocab.token_types))
    writer.add_token_merges(list(vocab.merges))
    for value, add in ((vocab.bos_token_id, writer.add_bos_token_id), (vocab.eos_token_id, writer.add_eos_token_id),
                       (vocab.pad_token_id, writer.add_pad_token_id)):
        if value is not None:
            add(value)
    writer.add_add_bos_token(vocab.add_bos)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)
