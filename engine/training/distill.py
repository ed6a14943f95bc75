"""Distillation loss: the draft learns the target's next-token distribution, not just the data.

A draft is useful only when it agrees with the target, so it is trained against the
target's logits (at temperature 1, since greedy acceptance only needs the top token
to agree), mixed with a little of the plain data loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


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
