"""Every `SamplingParams` field changes the sampled tokens the way its definition says.

The reference is transformers' next-token distribution on the same tiny checkpoint: the engine draws
the first token of many requests, one seed each (deterministic), and the draws are checked against
that distribution. top-p and top-k must keep every draw inside the nucleus / the k most likely tokens
(while without them draws do land outside), and temperature must move the mean logit of the drawn
tokens to where softmax(logits / T) puts it, within five standard errors, a band that a sampler
ignoring the temperature misses by far more. `seed`, `stop` and `ignore_eos` are covered in
tests/engine/test_engine_api.py (seeded sampling, stop strings, EOS); `max_tokens` is here.

Public API only, on the small random checkpoints of tests/support/tiny_models.py.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import Engine, EngineConfig, SamplingParams

PROMPT = [10, 11, 12]
NUM_DRAWS = 200
TOLERANCE_IN_STANDARD_ERRORS = 5


@pytest.fixture(scope="module")
def next_token_logits(tiny_llama_dir) -> torch.Tensor:
    """transformers' float32 logits for the token after PROMPT."""
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([PROMPT])).logits[0, -1]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    with Engine(EngineConfig(model=tiny_llama_dir, device="cpu", dtype="float32", max_num_seqs=NUM_DRAWS)) as eng:
        yield eng


@pytest.fixture(scope="module")
def first_tokens(engine):
    """The first token of NUM_DRAWS requests with these sampling settings, seeds 0..NUM_DRAWS-1 (memoised)."""
    cache: dict[tuple, list[int]] = {}

    def draw(**settings) -> list[int]:
        key = tuple(sorted(settings.items()))
        if key not in cache:
            handles = [engine.submit(PROMPT, SamplingParams(max_tokens=1, seed=seed, **settings))
                       for seed in range(NUM_DRAWS)]
            cache[key] = [handle.result().token_ids[0] for handle in handles]
        return cache[key]
    return draw


def test_top_p_keeps_every_draw_in_the_nucleus(first_tokens, next_token_logits):
    """top_p halfway between the masses of the 5 and the 6 most likely tokens: the nucleus is those 6."""
    probs, order = torch.sort(torch.softmax(next_token_logits, dim=-1), descending=True)
    mass = torch.cumsum(probs, dim=-1)
    size = 6
    top_p = float(mass[size - 2] + mass[size - 1]) / 2
    kept = set(order[:size].tolist())
    restricted = first_tokens(temperature=1.0, top_p=top_p)
    free = first_tokens(temperature=1.0, top_p=1.0)
    assert set(restricted) <= kept
    assert len(set(restricted)) >= size - 1, "the nucleus is sampled, not just its top token"
    assert 1 - float(mass[size - 1]) > 0.5, "most of the mass lies outside this nucleus"
    assert sum(token not in kept for token in free) > NUM_DRAWS * 0.4, "with top_p=1 draws do fall outside it"


def test_top_k_keeps_every_draw_in_the_k_most_likely(first_tokens, next_token_logits):
    top_k = 4
    most_likely = set(torch.topk(next_token_logits, top_k).indices.tolist())
    restricted = first_tokens(temperature=1.0, top_k=top_k)
    free = first_tokens(temperature=1.0, top_p=1.0)
    assert set(restricted) == most_likely, "every one of the k tokens is drawn, and nothing else"
    assert sum(token not in most_likely for token in free) > NUM_DRAWS * 0.5


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_shapes_the_distribution_as_softmax_of_logits_over_t(first_tokens, next_token_logits,
                                                                          temperature):
    """The mean reference logit of the drawn tokens matches its expectation under softmax(logits / T)."""
    logits = next_token_logits

    def mean_and_standard_error(t: float) -> tuple[float, float]:
        probs = torch.softmax(logits / t, dim=-1)
        mean = float((probs * logits).sum())
        spread = float((probs * (logits - mean) ** 2).sum().sqrt())
        return mean, spread / NUM_DRAWS ** 0.5

    expected, standard_error = mean_and_standard_error(temperature)
    tolerance = TOLERANCE_IN_STANDARD_ERRORS * standard_error
    if temperature != 1.0:
        untempered, _ = mean_and_standard_error(1.0)
        assert abs(expected - untempered) > 2 * tolerance, "a sampler ignoring T could not pass"
    drawn = first_tokens(temperature=temperature)
    observed = float(logits[drawn].mean())
    assert observed == pytest.approx(expected, abs=tolerance)


def test_temperature_zero_is_greedy(first_tokens, next_token_logits):
    assert set(first_tokens(temperature=0.0)) == {int(next_token_logits.argmax())}


@pytest.mark.parametrize("max_tokens", [1, 7])
def test_max_tokens_is_the_output_length(engine, max_tokens):
    output = engine.generate(PROMPT, SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0]
    assert len(output.token_ids) == max_tokens and output.finish_reason == "length"
    assert output.metrics.output_tokens == max_tokens
