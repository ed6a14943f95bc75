"""The rejection rule of speculative decoding: which proposed tokens the target accepts, and what follows.

A request that verifies k proposals x_1..x_k gets k + 1 logits rows from the target: its distribution
after its last token and after each proposal. Proposal j is accepted with probability
min(1, p_j(x_j) / q_j(x_j)), p being the target's distribution filtered exactly as sampling filters it
and q the proposer's (a point mass, q(x_j) = 1, for n-gram and greedy proposals). At the first
rejection the token is drawn from max(0, p_j - q_j) renormalised; when all k are accepted a bonus
token is drawn from the last row. The output is then distributed exactly as the target's own
(Leviathan et al. 2023; Chen et al. 2023). A greedy request accepts a proposal iff it is the target's
argmax and takes the argmax after the accepted ones, so its output is the non-speculative greedy
output, token for token.

The rule runs as tensor operations over a padded [requests, k + 1] grid, as gpt-fast and vLLM do,
with no Python loop over rows. Its uniforms come from the sampler's counter-based RNG keyed by
(seed, output position), one stream per decision, so a seeded request gives the same tokens
whatever it is batched with. The bonus token draws on the sampler's own stream, so a request with
nothing proposed samples exactly as a non-speculative step would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model.sampler import SamplingTensors, counter_uniform, filtered_probs, greedy, sample_from

STREAM_SAMPLE = 0  # the sampler's own stream (bonus tokens, and every non-speculative draw)
STREAM_ACCEPT = 1
STREAM_RESIDUAL = 2
STREAM_DRAFT = 3  # the draft model's own draws of its proposals


@dataclass(frozen=True)
class Verified:
    """Per request: its tokens for this step (accepted proposals, then one from the target), how
    many proposals were accepted, and whether its logits were usable (False: fail the request)."""

    tokens: list[list[int]]
    num_accepted: list[int]
    valid: list[bool]


def verify(logits: torch.Tensor, proposals: list[list[int]], settings: SamplingTensors,
           proposal_probs: list[torch.Tensor | None] | None = None) -> Verified:
    """Apply the rejection rule to each request's proposals.

    `logits` [sum(1 + len(p)), vocab] are the target's rows, request after request; `settings` holds
    one row per request, whose `positions` is the output index of that request's first row's token.
    `proposal_probs[i]` is request i's proposal distribution [len(p), vocab], or None for point masses.
    """
    device = logits.device
    counts_list = [len(p) for p in proposals]
    width = max(counts_list, default=0)
    counts = torch.tensor(counts_list, dtype=torch.long, device=device)
    starts = torch.cumsum(counts + 1, 0) - (counts + 1)
    offsets = torch.arange(width + 1, device=device)
    rows = starts[:, None] + torch.minimum(offsets[None, :], counts[:, None])   # padding repeats the last row
    drafts = torch.tensor([p + [0] * (width - len(p)) for p in proposals], dtype=torch.long,
                          device=device).view(len(proposals), width)
    positions = settings.positions[:, None] + offsets[None, :]

    row_ok = ~torch.isnan(logits).any(dim=-1) & torch.isfinite(logits.max(dim=-1).values)
    argmax = torch.argmax(logits, dim=-1)[rows]                                   # [requests, k + 1]
    accepted = argmax[:, :width] == drafts
    valid = row_ok[rows].all(dim=1)
    sampled = torch.nonzero(settings.temperature > 0).squeeze(1)
    rule = None
    if sampled.numel():
        rule = _SampledRule(logits, rows[sampled], drafts[sampled], counts[sampled], positions[sampled],
                            settings, sampled, proposal_probs)
        accepted[sampled] = rule.accepted
        valid[sampled] &= rule.rows_valid
    accepted &= offsets[None, :width] < counts[:, None]
    num_accepted = torch.cumprod(accepted.long(), dim=1).sum(dim=1)
    final = argmax.gather(1, num_accepted[:, None]).squeeze(1)
    if rule is not None:
        final[sampled] = rule.final_tokens(num_accepted[sampled])
    accepted_counts = num_accepted.tolist()
    tokens = [p[:a] + [t] for p, a, t in zip(proposals, accepted_counts, final.tolist(), strict=True)]
    return Verified(tokens, accepted_counts, valid.tolist())


def verify_greedy(logits: torch.Tensor, proposals: list[list[int]]) -> Verified:
    """The rule for a batch of greedy requests only, what `verify` gives them: each accepts its proposals while
    they are the target's argmax, then takes the argmax after them. One reduction over the logits and a walk
    over lists: at batch 1 on a CPU, `verify`'s padded grid and the settings tensors it needs cost more than the
    rule itself (the same reason the plain sampler has `greedy`)."""
    picked = greedy(logits)
    argmax, row_ok = picked.tokens.tolist(), picked.valid.tolist()
    tokens, num_accepted, valid = [], [], []
    row = 0
    for proposal in proposals:
        accepted = 0
        while accepted < len(proposal) and proposal[accepted] == argmax[row + accepted]:
            accepted += 1
        tokens.append(proposal[:accepted] + [argmax[row + accepted]])
        num_accepted.append(accepted)
        valid.append(all(row_ok[row: row + len(proposal) + 1]))
        row += len(proposal) + 1
    return Verified(tokens, num_accepted, valid)


class _SampledRule:
    """The rejection rule for the sampled requests of a batch (greedy ones only need argmaxes)."""

    def __init__(self, logits, rows, drafts, counts, positions, settings: SamplingTensors, index,
                 proposal_probs):
        width = drafts.shape[1]
        per_row = rows.shape[1]
        probs = filtered_probs(logits.index_select(0, rows.flatten()),
                               settings.temperature[index].repeat_interleave(per_row),
                               settings.top_k[index].repeat_interleave(per_row),
                               settings.top_p[index].repeat_interleave(per_row)).view(*rows.shape, -1)
        self.rows_valid = (torch.isfinite(probs).all(dim=-1) & (probs.sum(dim=-1) > 0)).all(dim=1)
        self.probs = torch.nan_to_num(probs, nan=0.0).clamp(min=0)
        self.drafts = drafts
        self.counts = counts
        self.positions = positions
        self.seeds = settings.seeds[index]
        self.q = self._proposal_distributions(proposal_probs, index, width)
        target_of_draft = self.probs[:, :width].gather(2, drafts[..., None]).squeeze(2)
        proposal_of_draft = (torch.ones_like(target_of_draft) if self.q is None
                             else self.q.gather(2, drafts[..., None]).squeeze(2))
        uniforms = counter_uniform(self.seeds[:, None].expand_as(drafts), positions[:, :width], STREAM_ACCEPT)
        # u < p / q, written without the division (q > 0 for every token a proposer drew)
        self.accepted = uniforms * proposal_of_draft.double() < target_of_draft.double()

    def _proposal_distributions(self, proposal_probs, index, width) -> torch.Tensor | None:
        """[sampled requests, k, vocab] proposal distributions; point masses as one-hot rows."""
        if proposal_probs is None or width == 0:
            return None
        chosen = [proposal_probs[i] for i in index.tolist()]
        if all(q is None for q in chosen):
            return None
        vocab = self.probs.shape[-1]
        q = torch.zeros(len(chosen), width, vocab, dtype=self.probs.dtype, device=self.probs.device)
        for row, (probs, count) in enumerate(zip(chosen, self.counts.tolist(), strict=True)):
            if probs is None:
                q[row, :count].scatter_(1, self.drafts[row, :count, None], 1.0)
            else:
                q[row, :count] = probs[:count]
        return q

    def final_tokens(self, num_accepted: torch.Tensor) -> torch.Tensor:
        """The token after the accepted proposals: from the residual at a rejection, else the bonus."""
        batch = torch.arange(num_accepted.shape[0], device=num_accepted.device)
        target = self.probs[batch, num_accepted]
        bonus = num_accepted == self.counts
        width = self.drafts.shape[1]
        if width:
            rejected_at = num_accepted.clamp(max=width - 1)
            if self.q is None:
                proposal = torch.zeros_like(target).scatter_(1, self.drafts[batch, rejected_at][:, None], 1.0)
            else:
                proposal = self.q[batch, rejected_at]
            residual = (target - proposal * (~bonus)[:, None]).clamp(min=0)
            residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, target)
        else:
            residual = target
        position = self.positions.gather(1, num_accepted[:, None]).squeeze(1)
        uniforms = torch.where(bonus, counter_uniform(self.seeds, position, STREAM_SAMPLE),
                               counter_uniform(self.seeds, position, STREAM_RESIDUAL))
        return sample_from(residual, uniforms)
