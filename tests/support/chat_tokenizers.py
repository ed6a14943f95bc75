"""Small tokenizers in the chat formats of the curated models, built here (no download): ChatML as Qwen2.5 writes it
(its tool list in the system turn, and tool tokens that are added but not special), Llama 3 (header tokens, a BOS
added to every sequence) and SmolLM2 (ChatML with its code-corpus special tokens and its default system prompt).

Why: the check that text a user typed never becomes a control token must run on the token sets and templates the
curated models use, offline. Each tokenizer is a byte-level BPE trained on a few sentences, with the format's special
tokens, added tokens and chat template.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

CHATML_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    "{% else %}You are a helpful assistant.{% endif %}\n\n# Tools\n\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object within <tool_call></tool_call> tags."
    "<|im_end|>\n{% elif messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}{% if not (tools and loop.first and message['role'] == 'system') %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "{% if message.tool_calls is defined %}\n<tool_call>\n{{ message.tool_calls | tojson }}\n</tool_call>{% endif %}"
    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
SMOLLM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n{% endif %}<|im_start|>"
    "{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# format -> (special tokens, added tokens that are not special, chat template, bos, eos, whether BOS starts any text)
CHAT_FORMATS = {
    "chatml": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], ["<tool_call>", "</tool_call>"], CHATML_TEMPLATE,
               None, "<|im_end|>", False),
    "llama3": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|eom_id|>", "<|python_tag|>", *[f"<|reserved_special_token_{i}|>" for i in range(4)]], [],
               LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>", True),
    "smollm": (["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>", "<filename>",
                "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>", "<jupyter_text>",
                "<jupyter_code>", "<jupyter_output>", "<jupyter_script>", "<empty_output>"], [], SMOLLM_TEMPLATE,
               "<|im_start|>", "<|im_end|>", False),
}
TRAINING_TEXT = ["The engine batches requests together.", "Paged attention stores keys and values in blocks.",
                 "héllo wörld, naïve café — ünïcode ✓", "def add(a, b):\n    return a + b",
                 "<tool> | im start end header system user assistant"] * 20


def build_chat_tokenizer(chat_format: str, folder: Path):
    """The tokenizer of `chat_format` ("chatml", "llama3", "smollm"), saved in `folder` and loaded back as the
    engine loads one (AutoTokenizer)."""
    special, added, template, bos, eos, bos_first = CHAT_FORMATS[chat_format]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(TRAINING_TEXT, trainers.BpeTrainer(
        vocab_size=600, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if bos_first:
        bos_id = tokenizer.token_to_id(bos)
        tokenizer.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                                 special_tokens=[(bos, bos_id)])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=bos, eos_token=eos,
                                      pad_token=special[0], additional_special_tokens=special)
    wrapped.add_tokens(added)
    wrapped.chat_template = template
    wrapped.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)
