"""Measurements for the model card: perplexity, recall, speculative acceptance, forward cost.

Everything runs on the HF models with plain loops, independent of the serving engine, so
the card states what the pair itself can give: the acceptance rate comes from a greedy
draft-then-verify loop, the cost ratio from timing one batch-1 decode step of each model.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from engine.training.answer_check import opening_similarity, opens_with_reference, repeats_four_words


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


def prompt_text(tokenizer: PreTrainedTokenizerBase, question: str | list[dict]) -> str:
    """A chat (one question, or the messages so far) rendered up to the start of the assistant's turn."""
    messages = [{"role": "user", "content": question}] if isinstance(question, str) else question
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prompt_ids(tokenizer: PreTrainedTokenizerBase, question: str | list[dict]) -> list[int]:
    return tokenizer(prompt_text(tokenizer, question), add_special_tokens=False).input_ids


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
    question: str | list[dict],
    max_new_tokens: int = 128,
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


@dataclass(frozen=True)
class GradedAnswer:
    """One greedy answer and what the answer check says about it."""

    question: str
    answer: str
    reference: str
    similarity: float
    on_topic: bool
    repeats: bool


def grade_answers(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cases: list[tuple[str, str]]
) -> list[GradedAnswer]:
    """Greedy answers to (question, reference answer) pairs, each checked by `answer_check`."""
    return [graded(question, greedy_answer(model, tokenizer, question), reference) for question, reference in cases]


def graded(question: str, answer: str, reference: str, echoes_earlier: bool = False) -> GradedAnswer:
    """`answer` checked against `reference` by `answer_check`; `echoes_earlier` also counts as a repeat."""
    repeats = repeats_four_words(answer, reference) or echoes_earlier
    return GradedAnswer(question, answer, reference, opening_similarity(answer, reference),
                        opens_with_reference(answer, reference), repeats)


def grade_follow_ups(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cases: list[tuple[str, str, str, str]]
) -> list[GradedAnswer]:
    """The second answers of two-question conversations: the model answers the first question greedily, then
    the follow-up in the same conversation. A second answer `repeats` when it repeats a 4-word run or opens
    like the first entry's reference and closer to it than to its own (the previous answer again: "Shallow copy
    operation" after `copy.deepcopy`'s "Deep copy operation" is `copy.copy`'s own sentence, not a repeat)."""
    results = []
    for first, first_reference, follow_up, reference in cases:
        messages = [{"role": "user", "content": first}]
        messages += [{"role": "assistant", "content": greedy_answer(model, tokenizer, messages)},
                     {"role": "user", "content": follow_up}]
        answer = greedy_answer(model, tokenizer, messages)
        echoes_first = opens_with_reference(answer, first_reference) and (
            opening_similarity(answer, first_reference) > opening_similarity(answer, reference))
        results.append(graded(f"{first} / {follow_up}", answer, reference, echoes_first))
    return results


@torch.no_grad()
def decode_step_seconds(model: PreTrainedModel, prompt_len: int = 48, steps: int = 64) -> list[float]:
    """Wall time of each of `steps` batch-1 decode forwards (one new token over a KV cache)."""
    ids = torch.arange(3, 3 + prompt_len).unsqueeze(0) % model.config.vocab_size
    cache = model(input_ids=ids, use_cache=True).past_key_values
    token = ids[:, -1:]
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        cache = model(input_ids=token, past_key_values=cache, use_cache=True).past_key_values
        times.append(time.perf_counter() - start)
    return times


def forward_cost_ratio(draft: PreTrainedModel, target: PreTrainedModel, rounds: int = 5) -> float:
    """Median draft decode-step time over the target's, from interleaved rounds in one process.

    Interleaving keeps a busy machine's slow spells from landing on one model only.
    """
    draft_times, target_times = [], []
    for _ in range(rounds):
        draft_times += decode_step_seconds(draft)
        target_times += decode_step_seconds(target)
    return statistics.median(draft_times) / statistics.median(target_times)
