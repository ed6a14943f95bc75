"""Log-probabilities of the tokens a step emits, from the logits rows the sampler already has.

Reported as vLLM reports them by default: the log-softmax of the model's RAW logits, before
temperature, top-k / top-p and any grammar mask, so a value says what the model thought of the
token, whatever the request's sampling settings did with it. One pass per step over only the rows
whose request asked (`SamplingParams.logprobs`), nothing at all when none did.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability and the `logprobs` most likely (token id, log-probability), most likely
    first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class LogprobRow:
    """One emitted token to report: the logits row it was chosen from, the token, and how many alternatives."""

    row: int
    token_id: int
    top: int


def token_logprobs(logits: torch.Tensor, wanted: list[LogprobRow]) -> list[TokenLogprob]:
    """`TokenLogprob` of each wanted token, from `logits` [rows, vocab] (raw, float32), in `wanted`'s order."""
    if not wanted:
        return []
    rows = torch.tensor([w.row for w in wanted], dtype=torch.long, device=logits.device)
    log_probs = torch.log_softmax(logits.index_select(0, rows).float(), dim=-1)
    tokens = torch.tensor([w.token_id for w in wanted], dtype=torch.long, device=logits.device)
    chosen = log_probs.gather(1, tokens[:, None]).squeeze(1).tolist()
    k = min(max(w.top for w in wanted), logits.shape[-1])
    top_values, top_ids = ([], []) if k == 0 else (t.tolist() for t in torch.topk(log_probs, k, dim=-1))
    return [TokenLogprob(w.token_id, chosen[i], tuple(zip(top_ids[i][:w.top], top_values[i][:w.top], strict=True))
                         if w.top else ())
            for i, w in enumerate(wanted)]
