"""Measurements for the model card: held-out perplexity, speculative acceptance, answers.

The acceptance rate is measured with a plain greedy draft-then-verify loop over the HF
models, independent of the serving engine, so the card states what the pair can give.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase


@torch.no_grad()
def perplexity(model: PreTrainedModel, data: torch.Tensor, batch_size: int = 16) -> float:
    """exp of the mean next-token loss over every window of `data`."""
    total, count = 0.0, 0
    for start in range(0, len(data), batch_size):
        batch = data[start: start + batch_size]
        logits = model(input_ids=batch[:, :-1]).logits
        total += F.cross_entropy(
            logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum"
        ).item()
        count += batch[:, 1:].numel()
    return math.exp(total / count)


def prompt_ids(tokenizer: PreTrainedTokenizerBase, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False).input_ids


@torch.no_grad()
def greedy_next(model: PreTrainedModel, ids: list[int]) -> int:
    return int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())


@torch.no_grad()
def speculative_acceptance(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[str],
    num_speculative: int = 4,
    max_new_tokens: int = 64,
) -> tuple[int, int]:
    """Greedy speculative decoding; returns (accepted, proposed) draft tokens over all prompts.

    Each round the draft proposes `num_speculative` tokens greedily, the target scores them
    in one pass, the longest agreeing prefix is kept plus the target's own next token.
    """
    accepted = proposed = 0
    eos = tokenizer.eos_token_id
    for question in questions:
        ids = prompt_ids(tokenizer, question)
        prompt_len = len(ids)
        while len(ids) - prompt_len < max_new_tokens and ids[-1] != eos:
            guess = list(ids)
            for _ in range(num_speculative):
                guess.append(greedy_next(draft, guess))
            choices = target(input_ids=torch.tensor([guess])).logits[0, len(ids) - 1:].argmax(-1)
            proposal = guess[len(ids):]
            agree = 0
            while agree < num_speculative and proposal[agree] == int(choices[agree]):
                agree += 1
            accepted += agree
            proposed += num_speculative
            ids.extend(proposal[:agree] + [int(choices[agree])])
            if eos in ids[prompt_len:]:
                ids = ids[: ids.index(eos, prompt_len) + 1]
    return accepted, proposed


@torch.no_grad()
def greedy_answer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    question: str,
    max_new_tokens: int = 160,
) -> str:
    ids = torch.tensor([prompt_ids(tokenizer, question)])
    output = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return tokenizer.decode(output[0, ids.shape[1]:], skip_special_tokens=True).strip()
