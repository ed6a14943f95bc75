"""The batched sampler: greedy, filters, the target distribution, reproducibility, verification rows."""

from __future__ import annotations

import math

import pytest
import torch

from engine.model.sampler import SamplingTensors, counter_uniform, filtered_probs, greedy, sample

VOCAB = 8


def settings(rows: int, temperature=1.0, top_k=0, top_p=1.0, seeds=None, positions=None) -> SamplingTensors:
    return SamplingTensors.build([temperature] * rows, [top_k] * rows, [top_p] * rows,
                                 seeds if seeds is not None else [7] * rows,
                                 positions if positions is not None else list(range(rows)), "cpu")


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])


def test_greedy_rows_take_the_argmax_and_sampled_rows_do_not_always():
    logits = LOGITS.expand(400, VOCAB)
    greedy = sample(logits, settings(400, temperature=0.0)).tokens
    assert (greedy == 0).all()
    sampled = sample(logits, settings(400, temperature=1.0)).tokens
    assert len(set(sampled.tolist())) > 3


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_sampled_tokens_follow_softmax_of_logits_over_temperature(temperature):
    rows = 20_000
    tokens = sample(LOGITS.expand(rows, VOCAB), settings(rows, temperature=temperature)).tokens
    counts = torch.bincount(tokens, minlength=VOCAB).double()
    expected = torch.softmax(LOGITS.double() / temperature, -1)
    # 7 degrees of freedom: P(chi2 > 30) < 1e-4. A sampler ignoring the temperature is far off.
    assert chi_square(counts, expected) < 30
    wrong = torch.softmax(LOGITS.double(), -1) if temperature != 1.0 else torch.softmax(LOGITS.double() / 2, -1)
    assert chi_square(counts, wrong) > 100


def test_top_k_and_top_p_restrict_the_support():
    rows = 5_000
    top_k = sample(LOGITS.expand(rows, VOCAB), settings(rows, top_k=3)).tokens
    assert set(top_k.tolist()) == {0, 1, 2}
    probs = torch.softmax(LOGITS, -1)  # 0.34, 0.21, 0.13, ...: the 0.5-nucleus is the first two tokens
    top_p = sample(LOGITS.expand(rows, VOCAB), settings(rows, top_p=0.5)).tokens
    assert set(top_p.tolist()) == {0, 1}
    kept = filtered_probs(LOGITS.expand(1, VOCAB), torch.ones(1), torch.zeros(1, dtype=torch.long),
                          torch.tensor([0.5]))[0]
    assert kept[:2] == pytest.approx((probs[:2] / probs[:2].sum()).tolist(), rel=1e-5)
    assert (kept[2:] == 0).all()


def test_a_seeded_row_is_the_same_in_any_batch_and_any_row():
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(0))
    seeds, positions = [11, 12, 13, 14, 15, 16], [0, 5, 9, 2, 2, 7]
    together = sample(logits, settings(6, seeds=seeds, positions=positions)).tokens
    order = [5, 3, 1, 0, 4, 2]
    shuffled = sample(logits[order], settings(6, seeds=[seeds[i] for i in order],
                                              positions=[positions[i] for i in order])).tokens
    assert shuffled.tolist() == [together[i].item() for i in order]
    alone = [sample(logits[i:i + 1], settings(1, seeds=[seeds[i]], positions=[positions[i]])).tokens.item()
             for i in range(6)]
    assert alone == together.tolist()


def test_verification_rows_of_one_request_draw_independently():
    """Rows at consecutive output positions of one seed are independent draws, not one draw repeated."""
    rows = 4_000
    tokens = sample(LOGITS.expand(rows, VOCAB), settings(rows, seeds=[3] * rows, positions=list(range(rows)))).tokens
    counts = torch.bincount(tokens, minlength=VOCAB).double()
    assert chi_square(counts, torch.softmax(LOGITS.double(), -1)) < 30
    pairs = torch.stack([tokens[:-1], tokens[1:]])
    assert (pairs[0] == pairs[1]).double().mean() < 0.35  # sum p^2 is about 0.21 for independent draws


def test_a_row_with_unusable_logits_is_invalid_alone():
    logits = LOGITS.expand(4, VOCAB).clone()
    logits[1, 3] = float("nan")
    logits[2] = float("-inf")
    result = sample(logits, SamplingTensors.build([0.0, 0.0, 1.0, 1.0], [0] * 4, [1.0] * 4, [1] * 4, [0] * 4, "cpu"))
    assert result.valid.tolist() == [True, False, False, True]
    assert result.tokens[0].item() == 0


def test_the_greedy_shortcut_picks_what_greedy_settings_pick():
    """`greedy` (a batch of greedy requests, no settings tensors) equals `sample` with temperature 0, validity too."""
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(4))
    logits[3, 2] = float("nan")
    shortcut, full = greedy(logits), sample(logits, settings(5, temperature=0.0))
    assert shortcut.tokens.tolist() == full.tokens.tolist()
    assert [shortcut.tokens[row].item() for row in (0, 1, 2, 4)] == logits[[0, 1, 2, 4]].argmax(-1).tolist()
    assert shortcut.valid.tolist() == full.valid.tolist() == [True, True, True, False, True]


def test_counter_uniform_is_uniform_and_streams_differ():
    counters = torch.arange(50_000)
    u = counter_uniform(torch.full_like(counters, 42), counters)
    assert 0 <= float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.003
    other = counter_uniform(torch.full_like(counters, 42), counters, stream=1)
    assert abs(float(torch.corrcoef(torch.stack([u, other]))[0, 1])) < 0.02
    assert torch.equal(u, counter_uniform(torch.full_like(counters, 42), counters))
    huge = counter_uniform(torch.tensor([-(2**63), 2**63 - 1]), torch.tensor([0, 0]))
    assert not math.isclose(float(huge[0]), float(huge[1]))
