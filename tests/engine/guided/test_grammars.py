"""Compiling and enforcing grammars without running a model: refusals (an unsupported schema keyword by name, bad
JSON, a bad regex or grammar, the bounds), the cache, masks of verification rows, proposals cut at the first token
the grammar rejects, and a grammar that fails inside a step failing only its own request.

On the demo model's tokenizer; the only engine here is the refusal test's (it checks `Engine.check_guided` and
`submit` refuse before admission)."""

from __future__ import annotations

import ctypes
import json

import pytest
import torch

from engine import Engine, EngineConfig, GuidedDecoding, RequestError, SamplingParams
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest
from engine.guided import grammars
from engine.guided.grammars import GrammarCompiler
from engine.guided.masks import apply_grammar_masks
from engine.hub import load_tokenizer, resolve_model_path
from engine.sampling_params import MAX_SPEC_CHARS
from engine.speculative.speculator import Speculator

YES_NO = GuidedDecoding("regex", "(yes|no)!")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model_path("demo"))


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, len(tokenizer), frozenset({tokenizer.eos_token_id}))


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def guided_request(tokenizer, compiler, guided: GuidedDecoding = YES_NO) -> Request:
    request = Request([5, 6, 7], SamplingParams(guided=guided), frozenset({tokenizer.eos_token_id}), 1024,
                      IncrementalDetokenizer(tokenizer, [5, 6, 7], ()), seed=0)
    request.grammar = compiler.compile(guided)[0].new_request_grammar()
    return request


def scheduled(request: Request, proposals: list[int] | None = None) -> ScheduledRequest:
    return ScheduledRequest(request, 1, [0], True, list(proposals or []))


REFUSED = {
    "unsupported keyword": (GuidedDecoding("json_schema", json.dumps({"type": "array", "uniqueItems": True})),
                            "cannot enforce: uniqueItems"),
    "two unsupported keywords": (GuidedDecoding("json_schema", json.dumps(
        {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}})), "cannot enforce: if, then"),
    "unknown format": (GuidedDecoding("json_schema", json.dumps({"type": "string", "format": "colour"})),
                       "Unknown format"),
    "not JSON": (GuidedDecoding("json_schema", "{not json"), "not valid JSON"),
    "not an object": (GuidedDecoding("json_schema", "[1, 2]"), "must be a JSON object"),
    "bad regex": (GuidedDecoding("regex", "(unclosed"), "unclosed group"),
    "bad grammar": (GuidedDecoding("grammar", "start: missing_rule"), "unknown name"),
    "too long": (GuidedDecoding("regex", "a" * (MAX_SPEC_CHARS + 1)), "at most"),
    "unknown kind": (GuidedDecoding("yaml", "a: 1"), "guided.kind"),
    "lone surrogate": (GuidedDecoding("regex", "a\ud800"), "lone surrogate"),
    "spec for json_object": (GuidedDecoding("json_object", "{}"), "must be empty"),
}


def test_refusals_name_the_problem_before_admission():
    with Engine(EngineConfig(model="demo")) as engine:
        for name, (guided, message) in REFUSED.items():
            with pytest.raises(RequestError, match=message):
                engine.check_guided(guided)
            with pytest.raises(RequestError, match=message):
                engine.submit("x", SamplingParams(max_tokens=4, guided=guided))
            assert not engine.stats().num_waiting, name
        with pytest.raises(RequestError, match="ignore_eos"):
            engine.submit("x", SamplingParams(max_tokens=4, ignore_eos=True, guided=YES_NO))


def test_a_lenient_schema_option_cannot_switch_the_refusal_off(compiler):
    schema = {"type": "array", "uniqueItems": True, "x-guidance": {"lenient": True}}
    with pytest.raises(RequestError, match="uniqueItems"):
        compiler.compile(GuidedDecoding("json_schema", json.dumps(schema)))


def test_compiled_grammars_are_cached_and_the_compile_time_is_bounded(compiler, monkeypatch):
    guided = GuidedDecoding("json_schema", json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}}))
    first, hit = compiler.compile(guided)
    again, hit_again = compiler.compile(guided)
    assert (hit, hit_again) == (False, True) and again is first and first.compile_seconds > 0
    monkeypatch.setattr(grammars, "MAX_COMPILE_SECONDS", 0.0)
    with pytest.raises(RequestError, match="over the bound"):
        compiler.compile(GuidedDecoding("regex", "[a-z]{1,5}"))


def test_verification_rows_are_masked_by_the_state_after_the_proposals_before_them(tokenizer, compiler):
    """Regex `(yes|no)!`: after "yes" only "!" may follow; the matcher is back where it was afterwards."""
    request = guided_request(tokenizer, compiler)
    yes = ids(tokenizer, "yes")
    logits = torch.zeros(1 + len(yes), len(tokenizer))
    apply_grammar_masks([scheduled(request, yes)], logits)
    allowed = [set(torch.isfinite(row).nonzero().squeeze(1).tolist()) for row in logits]
    assert yes[0] in allowed[0] and ids(tokenizer, "!")[0] not in allowed[0]
    assert allowed[-1] == {ids(tokenizer, "!")[0]}
    assert request.grammar.valid_prefix(yes) == len(yes), "rolled back: 'yes' is valid again from the start"


def test_proposals_are_cut_at_the_first_token_the_grammar_rejects(tokenizer, compiler):
    request = guided_request(tokenizer, compiler)
    plain = Request([5, 6, 7], SamplingParams(), frozenset(), 1024, IncrementalDetokenizer(tokenizer, [5, 6, 7], ()),
                    seed=0)
    proposal = ids(tokenizer, "yes") + ids(tokenizer, "?!")

    class FixedProposer:
        def propose(self, requests, lengths):
            return [list(proposal) for _ in requests], [None for _ in requests]

    for item in (request, plain):
        item.num_computed_tokens = item.num_tokens - 1  # ready to decode
    Speculator(FixedProposer(), len(proposal), 1024).propose([request, plain])
    assert request.spec_token_ids == ids(tokenizer, "yes")
    assert plain.spec_token_ids == proposal


def test_a_sampled_drafts_first_rejected_token_stays_for_the_rejection_rule(tokenizer, compiler):
    """Drawn from a distribution q, the first token the grammar rejects is kept (once): the rule refuses it and
    draws from max(0, p - q), as exactness needs; its row is masked by the state before it, and no row after it is
    walked (the matcher never consumes a rejected token)."""
    request = guided_request(tokenizer, compiler)
    valid, rejected = ids(tokenizer, "yes"), ids(tokenizer, "?")
    proposal = valid + rejected + ids(tokenizer, "!")

    class SampledDraft:
        def propose(self, requests, lengths):
            return [list(proposal)], [torch.full((len(proposal), len(tokenizer)), 1.0 / len(tokenizer))]

    request.num_computed_tokens = request.num_tokens - 1
    Speculator(SampledDraft(), len(proposal), 1024).propose([request])
    assert request.spec_token_ids == valid + rejected
    logits = torch.zeros(1 + len(request.spec_token_ids), len(tokenizer))
    result = apply_grammar_masks([scheduled(request, request.spec_token_ids)], logits)
    assert not result.failed and request.grammar.error() is None
    assert not torch.isfinite(logits[len(valid), rejected[0]]), "the rejected token's own row gives it 0"


def test_a_grammar_that_fails_in_a_step_fails_only_its_request(tokenizer, compiler):
    broken, healthy = guided_request(tokenizer, compiler), guided_request(tokenizer, compiler)

    class BrokenMatcher:
        def unsafe_compute_mask_ptr(self, pointer, size):
            raise RuntimeError("library failure")

    broken.grammar.matcher = BrokenMatcher()
    logits = torch.zeros(2, len(tokenizer))
    result = apply_grammar_masks([scheduled(broken), scheduled(healthy)], logits)
    assert list(result.failed) == [broken] and "library failure" in result.failed[broken]
    allowed = [tokenizer.decode([t]) for t in torch.isfinite(logits[1]).nonzero().squeeze(1).tolist()]
    assert allowed and all("yes".startswith(a) or "no".startswith(a) for a in allowed), allowed


def test_a_grammar_no_token_can_continue_fails_its_request_with_that_reason(tokenizer, compiler):
    stuck, healthy = guided_request(tokenizer, compiler), guided_request(tokenizer, compiler)

    class NothingAllowed:
        """What llguidance would write for a grammar none of the vocabulary's tokens can continue."""

        def unsafe_compute_mask_ptr(self, pointer, size):
            ctypes.memset(pointer, 0, size)

        def is_error(self):
            return False

    stuck.grammar.matcher = NothingAllowed()
    result = apply_grammar_masks([scheduled(stuck), scheduled(healthy)], torch.zeros(2, len(tokenizer)))
    assert list(result.failed) == [stuck] and "allows no token" in result.failed[stuck]
