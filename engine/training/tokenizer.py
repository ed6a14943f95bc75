"""A byte-level BPE tokenizer with ChatML-style chat tokens, saved in Hugging Face format.

Byte-level BPE never meets an unknown character, and the ChatML template is the one most
hub chat models use, so the engine's chat path is exercised the same way for both.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

DOCUMENT_TOKEN = "<|endoftext|>"
TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"
SPECIAL_TOKENS = [DOCUMENT_TOKEN, TURN_START, TURN_END]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Trains BPE on `texts` and wraps it so `AutoTokenizer` and `apply_chat_template` work.

    The end-of-turn token is the EOS so generation stops after one assistant answer;
    the document separator doubles as BOS and padding.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=DOCUMENT_TOKEN,
        eos_token=TURN_END,
        pad_token=DOCUMENT_TOKEN,
        model_max_length=1024,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped
