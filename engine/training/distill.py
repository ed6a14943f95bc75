"""Distillation loss: the draft learns the target's next-token distribution, not just the data.

A draft is useful only when it agrees with the target, so it is trained against the
target's logits (at temperature 1, since greedy acceptance only needs the top token
to agree), mixed with a little of the plain data loss. Teacher-forced documentation
answers only show the draft what the target says when it recalls; `target_replies`
adds what the target really says (on-policy), above all to questions it answers
from general knowledge, which is what a held-out question gets.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from engine.training.evaluate import prompt_text


def distillation_loss(
    teacher: torch.nn.Module, temperature: float = 1.0, kl_weight: float = 0.9
) -> Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]:
    """A loss for `model.train`: `kl_weight` * T^2 * KL(teacher_T || student_T) + rest * CE."""
    teacher.eval()

    def loss_fn(student: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        inputs, labels = batch[:, :-1], batch[:, 1:]
        with torch.no_grad():
            teacher_logits = teacher(input_ids=inputs).logits.flatten(0, 1)
        student_logits = student(input_ids=inputs).logits.flatten(0, 1)
        kl = F.kl_div(
            F.log_softmax(student_logits / temperature, dim=-1),
            F.log_softmax(teacher_logits / temperature, dim=-1),
            log_target=True,
            reduction="batchmean",
        )
        ce = F.cross_entropy(student_logits, labels.flatten())
        return kl_weight * temperature**2 * kl + (1 - kl_weight) * ce

    return loss_fn


@torch.no_grad()
def target_replies(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[str],
    max_new_tokens: int = 96,
    batch_size: int = 64,
) -> list[list[dict]]:
    """One chat per question: the question and the target's greedy reply, generated in left-padded batches."""
    chats = []
    for start in range(0, len(questions), batch_size):
        batch = questions[start: start + batch_size]
        prompts = [prompt_text(tokenizer, question) for question in batch]
        encoded = tokenizer(prompts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt")
        output = target.generate(
            **encoded, max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )
        replies = tokenizer.batch_decode(output[:, encoded.input_ids.shape[1]:], skip_special_tokens=True)
        chats += [[{"role": "user", "content": q}, {"role": "assistant", "content": r.strip()}]
                  for q, r in zip(batch, replies, strict=True)]
    return chats
