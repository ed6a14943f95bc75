"""Guided decoding on the bundled demo model, through the public API: every output of twenty JSON schemas finishes
"stop" and validates (jsonschema), one request at a time (streamed) and 32 at once, with speculative decoding off,
by n-gram and by the bundled draft; regex, Lark grammar and json_object outputs match; a max_tokens cut returns the
partial text with "length"; unguided neighbours' greedy output is unchanged; the mask's cost is reported.

One engine per speculative mode for the whole module; outputs are short (the schemas are bounded).
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from engine import Engine, EngineConfig, GuidedDecoding, SamplingParams
from tests.engine.guided.schemas import SCHEMAS

MAX_TOKENS = 96          # the longest schema output seen on the demo model is under 40 tokens
CONCURRENT = 32
TEMPERATURE = 0.8
SPECULATIVE = ("off", "ngram", "draft")


@pytest.fixture(scope="module", params=SPECULATIVE)
def engine(request):
    speculative = request.param
    with Engine(EngineConfig(model="demo", speculative=speculative, max_num_seqs=CONCURRENT,
                             draft_model="demo-draft" if speculative == "draft" else None)) as eng:
        yield eng


def schema_params(name: str, seed: int, **settings) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=TEMPERATURE, seed=seed,
                          guided=GuidedDecoding("json_schema", json.dumps(SCHEMAS[name])), **settings)


def prompt(name: str) -> list[dict]:
    return [{"role": "user", "content": f"Give a {name} as JSON."}]


def check_valid(name: str, text: str, finish_reason: str) -> None:
    assert finish_reason == "stop", f"{name}: {finish_reason} {text!r}"
    jsonschema.validate(json.loads(text), SCHEMAS[name])


def test_every_schema_one_at_a_time_streamed(engine):
    for seed, name in enumerate(SCHEMAS):
        deltas = list(engine.stream(prompt(name), schema_params(name, seed)))
        check_valid(name, "".join(d.text for d in deltas), deltas[-1].finish_reason)


def test_every_schema_with_32_concurrent_requests(engine):
    names = [list(SCHEMAS)[i % len(SCHEMAS)] for i in range(CONCURRENT)]
    handles = [engine.submit(prompt(name), schema_params(name, 100 + i)) for i, name in enumerate(names)]
    outputs = [handle.result() for handle in handles]
    for name, output in zip(names, outputs, strict=True):
        check_valid(name, output.text, output.finish_reason)
    assert engine.stats().peak_running >= CONCURRENT // 2, "the requests were batched together"
    assert engine.stats().prefix_cache_hit_rate > 0, "their chat template's prefix came from the prefix cache"
    if engine.config.speculative != "off":
        assert engine.stats().spec_num_accepted_tokens > 0, "proposals were verified and accepted under grammars"


def test_regex_lark_grammar_and_json_object_outputs_match(engine):
    regex = r"(yes|no), because [a-z ]{1,40}\."
    grammar = 'start: "The " NAME " module is " ADJ "."\nNAME: /[a-z]{1,10}/\nADJ: "useful" | "old" | "new"'
    by_regex = engine.generate("Is json useful?", SamplingParams(
        max_tokens=40, guided=GuidedDecoding("regex", regex)))[0]
    by_grammar = engine.generate("Which module?", SamplingParams(
        max_tokens=40, temperature=TEMPERATURE, seed=1, guided=GuidedDecoding("grammar", grammar)))[0]
    objects = engine.generate(['{"key": "value"}', "json.dumps({'a': 1})"], SamplingParams(
        max_tokens=64, guided=GuidedDecoding("json_object")))
    assert by_regex.finish_reason == "stop" and re.fullmatch(regex, by_regex.text), by_regex.text
    assert by_grammar.finish_reason == "stop"
    assert re.fullmatch(r"The [a-z]{1,10} module is (useful|old|new)\.", by_grammar.text), by_grammar.text
    for output in objects:
        assert output.finish_reason == "stop" and isinstance(json.loads(output.text), dict), output.text


def test_a_max_tokens_cut_returns_the_partial_text_with_length(engine):
    output = engine.generate(prompt("config"), SamplingParams(
        max_tokens=5, guided=GuidedDecoding("json_schema", json.dumps(SCHEMAS["config"]))))[0]
    assert output.finish_reason == "length"
    assert len(output.token_ids) == 5 and output.text.startswith('{"debug": ')


def test_unguided_greedy_output_is_unchanged_by_guided_neighbours(engine):
    plain = [f"What does the {module} module do?" for module in ("json", "os", "re")]
    params = SamplingParams(max_tokens=24)
    alone = [o.token_ids for o in engine.generate(plain, params)]
    guided = [engine.submit(prompt(name), schema_params(name, i)) for i, name in enumerate(list(SCHEMAS)[:6])]
    beside = [engine.submit(p, params) for p in plain]
    assert [h.result().token_ids for h in beside] == alone
    for name, handle in zip(list(SCHEMAS)[:6], guided, strict=True):
        output = handle.result()
        check_valid(name, output.text, output.finish_reason)


def test_mask_cost_and_compile_time_are_reported(engine):
    schema = json.dumps({**SCHEMAS["point"], "title": f"point for {engine.config.speculative}"})  # a new cache key
    guided = GuidedDecoding("json_schema", schema)
    first, second = (engine.generate(prompt("point"), SamplingParams(max_tokens=MAX_TOKENS, guided=guided))[0]
                     for _ in range(2))
    unguided = engine.generate(prompt("point"), SamplingParams(max_tokens=8))[0]
    assert first.metrics.guided_compile_s > 0 and second.metrics.guided_compile_s == 0, "compiled once, then cached"
    assert first.metrics.guided_mask_s > 0 and unguided.metrics.guided_mask_s == 0
    assert first.metrics.guided_mask_s < first.metrics.e2el
    assert any(step.guided_mask_duration > 0 for step in engine.step_history())


def test_logprobs_under_a_grammar_are_the_models_own(engine):
    """The reported log-probabilities are of the raw logits: where the grammar forced a token the model did not
    rank first, the top alternative is still the model's favourite, outside the grammar."""
    output = engine.generate(prompt("colour"), SamplingParams(
        max_tokens=MAX_TOKENS, logprobs=1, guided=GuidedDecoding("json_schema", json.dumps(SCHEMAS["colour"]))))[0]
    check_valid("colour", output.text, output.finish_reason)
    assert len(output.logprobs) == len(output.token_ids)
    assert all(entry.top[0][1] >= entry.logprob for entry in output.logprobs)
    assert any(entry.top[0][0] != entry.token_id for entry in output.logprobs), "some token was forced"


def test_tensor_parallel_ranks_give_the_same_guided_tokens_and_logprobs():
    """The engine's process masks and samples rank 0's logits: two ranks give the one-rank output (once, without
    speculation: the masks do not depend on the proposer)."""
    params = SamplingParams(max_tokens=MAX_TOKENS, logprobs=3,
                            guided=GuidedDecoding("json_schema", json.dumps(SCHEMAS["event"])))
    with Engine(EngineConfig(model="demo")) as single:
        one = single.generate(prompt("event"), params)[0]
    with Engine(EngineConfig(model="demo", tensor_parallel_size=2)) as sharded:
        two = sharded.generate(prompt("event"), params)[0]
    check_valid("event", two.text, two.finish_reason)
    assert two.token_ids == one.token_ids
    for a, b in zip(one.logprobs, two.logprobs, strict=True):
        assert abs(a.logprob - b.logprob) < 1e-4 and [t for t, _ in a.top] == [t for t, _ in b.top]
