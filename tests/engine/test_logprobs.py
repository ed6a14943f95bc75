"""`SamplingParams.logprobs`: the log-softmax of the model's raw logits (before temperature) for every emitted token
and its top alternatives, equal to transformers' float32 figures, in a continuous batch with requests that did not
ask, and under speculative decoding (each accepted or bonus token reports its own verification row).

A target whose second layer only nudges the first and a draft of its first layer (tests/support/spec_support.py)
make speculation accept some proposals and reject others; a repeated prompt gives n-gram lookup matches.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import MAX_TOP_LOGPROBS, Engine, EngineConfig, GuidedDecoding, RequestError, SamplingParams
from tests.support.spec_support import build_llama, build_truncated_draft
from tests.support.tiny_models import VOCAB

TEMPERATURE = 0.7
TOP = 5
MAX_TOKENS = 12
TOLERANCE = 1e-4


def make_prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    repeated = torch.randint(3, VOCAB, (10,), generator=generator).tolist()
    return [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in (3, 17)] + [repeated * 3]


PROMPTS = make_prompts()


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("logprob-pair")
    target = build_llama(root / "target", VOCAB, later_layer_scale=0.1)
    return target, build_truncated_draft(target, root / "draft")


@pytest.fixture(scope="module")
def reference(pair):
    """transformers' float32 log-softmax of the raw logits after each prefix of prompt + output."""
    model = AutoModelForCausalLM.from_pretrained(pair[0], dtype=torch.float32).eval()

    def log_probs(prompt: list[int], output: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1:-1]
        return torch.log_softmax(logits.float(), dim=-1)
    return log_probs


def check_against_reference(reference, prompt: list[int], output, top: int) -> None:
    expected = reference(prompt, output.token_ids)
    assert len(output.logprobs) == len(output.token_ids) > 1
    for position, (token, reported) in enumerate(zip(output.token_ids, output.logprobs, strict=True)):
        assert reported.token_id == token
        assert abs(reported.logprob - float(expected[position, token])) < TOLERANCE
        values, ids = torch.topk(expected[position], top)
        assert [t for t, _ in reported.top] == ids.tolist()
        assert torch.allclose(torch.tensor([v for _, v in reported.top]), values, atol=TOLERANCE)


@pytest.mark.parametrize("speculative", ["off", "ngram", "draft"])
def test_logprobs_are_the_raw_log_softmax_in_a_mixed_batch(pair, reference, speculative):
    """Three requests asking for logprobs (0 and TOP alternatives) sampled at a temperature other than 1, beside
    requests that do not ask; with speculation the accepted tokens' figures come from their verification rows."""
    target, draft = pair
    config = EngineConfig(model=target, dtype="float32", speculative=speculative,
                          draft_model=draft if speculative == "draft" else None, num_speculative_tokens=3)
    with Engine(config) as engine:
        asking = [engine.submit(p, SamplingParams(max_tokens=MAX_TOKENS, temperature=TEMPERATURE, seed=i,
                                                  ignore_eos=True, logprobs=TOP)) for i, p in enumerate(PROMPTS)]
        chosen_only = engine.submit(PROMPTS[0], SamplingParams(max_tokens=MAX_TOKENS, temperature=TEMPERATURE,
                                                               seed=7, ignore_eos=True, logprobs=0))
        silent = [engine.submit(p, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)) for p in PROMPTS]
        outputs = [handle.result() for handle in asking]
        only = chosen_only.result()
        quiet = [handle.result() for handle in silent]
        stats = engine.stats()
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        check_against_reference(reference, prompt, output, TOP)
    check_against_reference(reference, PROMPTS[0], only, 0)
    assert all(entry.top == () for entry in only.logprobs)
    assert all(output.logprobs is None for output in quiet)
    if speculative != "off":
        assert stats.spec_num_draft_tokens > 0, "proposals were verified"
    if speculative == "draft":
        assert stats.spec_num_accepted_tokens > 0, "some tokens came from accepted proposals"


def test_streamed_deltas_carry_one_logprob_per_token(pair):
    with Engine(EngineConfig(model=pair[0], dtype="float32")) as engine:
        deltas = list(engine.stream(PROMPTS[1], SamplingParams(max_tokens=6, ignore_eos=True, logprobs=2)))
    assert all(len(d.logprobs) == len(d.token_ids) for d in deltas)
    assert all(len(entry.top) == 2 for d in deltas for entry in d.logprobs)
    assert sum(len(d.token_ids) for d in deltas) == 6


@pytest.mark.parametrize("value", [-1, MAX_TOP_LOGPROBS + 1, True, 1.5, "3"])
def test_bad_logprobs_are_refused(value):
    with pytest.raises(RequestError, match="logprobs"):
        SamplingParams(logprobs=value).validate()


def test_the_transformers_backend_refuses_logprobs_and_guided_decoding(tiny_llama_dir):
    with Engine(EngineConfig(model=tiny_llama_dir, backend="hf", dtype="float32")) as engine:
        for params in (SamplingParams(max_tokens=2, logprobs=1),
                       SamplingParams(max_tokens=2, guided=GuidedDecoding("regex", "a+"))):
            with pytest.raises(RequestError, match="native backend"):
                engine.submit([5, 6, 7], params)
