"""Speculative decoding in the engine: exact greedy output, the target's sampling distribution, freed
blocks of both KV pools, the statistics, and the refusals.

The target is a random Llama whose second layer only nudges the first's output, and the draft its
first layer alone, so proposals are accepted often but not always (every path of the rule runs).
"""

from __future__ import annotations

import time

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from engine import ConfigError, Engine, EngineConfig, ModelLoadError, SamplingParams, estimate_memory
from engine.hub import curated_draft
from engine.model.spec import ModelSpec
from engine.runner.kv_cache import bytes_per_block
from engine.testing import EngineProbe
from tests.support.engine_waits import wait_until_idle
from tests.support.spec_support import build_llama, build_truncated_draft, chi_square_p_value
from tests.support.tiny_models import VOCAB, build_tiny_tokenizer

MAX_TOKENS = 32


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("spec-pair")
    target = build_llama(root / "target", VOCAB, later_layer_scale=0.1)
    return target, build_truncated_draft(target, root / "draft")


def make_prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in (1, 5, 23, 64, 9)]
    shared = torch.randint(3, VOCAB, (40,), generator=generator).tolist()
    repeated = torch.randint(3, VOCAB, (12,), generator=generator).tolist()
    return prompts + [shared + [7, 8, 9], shared + [10, 11], repeated * 3]


PROMPTS = make_prompts()


def run(model: str, speculative: str, draft: str | None, prompts=PROMPTS, max_tokens=MAX_TOKENS, **settings):
    config = EngineConfig(model=model, dtype="float32", speculative=speculative,
                          draft_model=draft if speculative == "draft" else None, **settings)
    with Engine(config) as engine:
        outputs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        return [o.token_ids for o in outputs], engine.stats()


def pair_budget(target: str, draft: str, max_model_len: int, block_size: int) -> int:
    """KV bytes for exactly one max-length sequence in both pools (forces preemption with several prompts)."""
    per_block = sum(bytes_per_block(ModelSpec.from_hf_config(AutoConfig.from_pretrained(m)), block_size, torch.float32)
                    for m in (target, draft))
    return -(-max_model_len // block_size) * per_block


SETTINGS = {
    "paged-prefix-cache": dict(block_size=8, prefix_caching=True),
    "chunked-prefill": dict(max_num_batched_tokens=16, block_size=4),
    "static": dict(batching="static", max_num_seqs=3),
    "contiguous": dict(kv_layout="contiguous", prefix_caching=False),
    "eager-attention": dict(attention="eager", num_speculative_tokens=2),
    "k-8": dict(num_speculative_tokens=8),
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_output_is_identical_with_and_without_speculation(pair, setting):
    target, draft = pair
    settings = SETTINGS[setting]
    plain, _ = run(target, "off", None, **settings)
    with_draft, draft_stats = run(target, "draft", draft, **settings)
    with_ngram, ngram_stats = run(target, "ngram", None, **settings)
    assert with_draft == plain
    assert with_ngram == plain
    for stats in (draft_stats, ngram_stats):
        assert 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens, "partly accepted proposals"
        assert stats.kv_blocks_free == stats.kv_blocks_total
    assert draft_stats.draft_kv_blocks_free == draft_stats.draft_kv_blocks_total > 0


def test_greedy_output_is_identical_under_preemption(pair):
    target, draft = pair
    max_model_len, block_size = 80, 4
    settings = dict(max_model_len=max_model_len, block_size=block_size,
                    kv_cache_bytes=pair_budget(target, draft, max_model_len, block_size))
    plain, _ = run(target, "off", None, **settings)
    with_draft, draft_stats = run(target, "draft", draft, **settings)
    with_ngram, ngram_stats = run(target, "ngram", None, **settings)
    assert with_draft == plain and with_ngram == plain
    assert draft_stats.num_preemptions > 0 and ngram_stats.num_preemptions > 0
    assert draft_stats.spec_num_accepted_tokens > 0
    assert draft_stats.kv_blocks_free == draft_stats.kv_blocks_total
    assert draft_stats.draft_kv_blocks_free == draft_stats.draft_kv_blocks_total


# ---- sampling: the output distribution is the target's ---------------------------------------------

SMALL_VOCAB = 8
SAMPLES = 6000
SAMPLED_PROMPT = [1, 5, 3]


def exact_joint(model_dir: str, prompt: list[int], length: int, temperature: float, top_k: int) -> torch.Tensor:
    """P(t1..t_length | prompt) of the target under these sampling settings, enumerating every continuation."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    joint = torch.ones(1, dtype=torch.float64)
    prefixes = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(length):
            logits = model(prefixes).logits[:, -1] / temperature
            if top_k:
                logits = logits.masked_fill(logits < logits.topk(top_k, dim=-1).values[:, -1:], float("-inf"))
            joint = (joint[:, None] * torch.softmax(logits, dim=-1)).flatten()
            prefixes = torch.cat([prefixes.repeat_interleave(SMALL_VOCAB, 0),
                                  torch.arange(SMALL_VOCAB).repeat(prefixes.shape[0])[:, None]], dim=1)
    return joint


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("small-vocab")
    target = build_llama(root / "target", SMALL_VOCAB, hidden_size=32, init_std=0.1, seed=3)
    draft = build_llama(root / "draft", SMALL_VOCAB, hidden_size=16, layers=1, init_std=0.1, seed=4)
    return target, draft


@pytest.mark.parametrize("speculative, temperature, top_k", [("draft", 1.0, 0), ("ngram", 1.0, 0), ("draft", 0.7, 5)])
def test_sampled_tokens_follow_the_target_distribution(small_vocab_pair, speculative, temperature, top_k):
    """Thousands of seeded samples of 3 tokens: their joint frequencies match the target's exact
    probabilities (a wrong acceptance or residual rule shifts them far outside the tolerance)."""
    target, draft = small_vocab_pair
    length = 3
    config = EngineConfig(model=target, dtype="float32", speculative=speculative, num_speculative_tokens=3,
                          draft_model=draft if speculative == "draft" else None, max_num_seqs=512,
                          max_num_batched_tokens=4096, seed=11)
    # n-gram proposals need repeats: the prompt ends in a bigram seen earlier
    prompt = SAMPLED_PROMPT + [4, 4, 4, 4, 6, 4, 4] if speculative == "ngram" else SAMPLED_PROMPT
    with Engine(config) as engine:
        outputs = engine.generate([prompt] * SAMPLES, SamplingParams(max_tokens=length, temperature=temperature,
                                                                     top_k=top_k, ignore_eos=True))
        stats = engine.stats()
    assert 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens
    codes = torch.tensor([sum(t * SMALL_VOCAB ** (length - 1 - i) for i, t in enumerate(o.token_ids))
                          for o in outputs])
    counts = torch.bincount(codes, minlength=SMALL_VOCAB ** length).double()
    assert chi_square_p_value(counts, exact_joint(target, prompt, length, temperature, top_k)) > 1e-4


def test_draft_proposals_are_the_drafts_own_greedy_continuation(pair, monkeypatch):
    """The draft's paged K/V (caught up, rolled back after rejections, shared through the prefix cache and
    recomputed after preemption) gives the same proposals as running the draft afresh on the context."""
    from engine.speculative.draft import DraftModelProposer

    target, draft = pair
    records = []
    propose = DraftModelProposer.propose

    def recording(self, requests, lengths):
        contexts = [r.all_token_ids for r in requests]
        proposals, probs = propose(self, requests, lengths)
        records.extend((c, p) for c, p in zip(contexts, proposals, strict=True) if p)
        return proposals, probs

    monkeypatch.setattr(DraftModelProposer, "propose", recording)
    from engine.runner.model_runner import ModelRunner

    in_one_call = []
    greedy_proposals = ModelRunner.greedy_proposals

    def counting(self, *args):
        result = greedy_proposals(self, *args)
        in_one_call.append(result is not None)
        return result

    monkeypatch.setattr(ModelRunner, "greedy_proposals", counting)
    max_model_len, block_size = 80, 4
    _, stats = run(target, "draft", draft, max_model_len=max_model_len, block_size=block_size,
                   kv_cache_bytes=pair_budget(target, draft, max_model_len, block_size))
    assert stats.num_preemptions > 0 and stats.prefix_cache_hit_rate > 0
    model = AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    assert len(records) > 50
    assert sum(in_one_call) > 20  # most proposals came from the draft's one-call greedy kernel path
    for context, proposal in records:
        ids = torch.tensor([context])
        fresh = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(proposal),
                               do_sample=False, pad_token_id=0)
        assert fresh[0, len(context):].tolist() == proposal


def test_seeded_sampling_with_speculation_is_reproducible(pair):
    target, draft = pair
    params = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, top_k=40, seed=77, ignore_eos=True)
    with Engine(EngineConfig(model=target, speculative="draft", draft_model=draft)) as engine:
        alone = engine.generate(PROMPTS[2], params)[0].token_ids
        batched = engine.generate([PROMPTS[2], PROMPTS[3], PROMPTS[4]], params)[0].token_ids
        again = engine.generate(PROMPTS[2], params)[0].token_ids
    assert alone == batched == again


# ---- blocks, statistics, refusals --------------------------------------------------------------------


def test_cancelling_mid_speculation_frees_every_block_of_both_models(pair):
    target, draft = pair
    with Engine(EngineConfig(model=target, speculative="draft", draft_model=draft, block_size=4)) as engine:
        streams = [engine.stream(p, SamplingParams(max_tokens=400, ignore_eos=True)) for p in PROMPTS[:4]]
        for stream in streams:
            while next(stream).metrics.spec_drafts == 0:  # cancel only once proposals were verified
                pass
        busy = engine.stats()
        assert busy.kv_blocks_free < busy.kv_blocks_total
        assert busy.draft_kv_blocks_free < busy.draft_kv_blocks_total
        for stream in streams:
            stream.close()
        stats = wait_until_idle(engine, timeout=30.0)
        assert stats.kv_blocks_free == stats.kv_blocks_total
        assert stats.draft_kv_blocks_free == stats.draft_kv_blocks_total
        assert set(EngineProbe(engine).request_leftovers().values()) == {0}
        after = engine.generate(PROMPTS[0], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    plain, _ = run(target, "off", None, prompts=[PROMPTS[0]], max_tokens=8)
    assert after.token_ids == plain[0]


def test_statistics_add_up(pair):
    target, draft = pair
    with Engine(EngineConfig(model=target, speculative="draft", draft_model=draft, num_speculative_tokens=3)) as engine:
        started = time.perf_counter()
        outputs = engine.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
        stats = engine.stats()
        steps = engine.step_history(started)
    proposed = sum(o.metrics.spec_proposed for o in outputs)
    accepted = sum(o.metrics.spec_accepted for o in outputs)
    drafts = sum(o.metrics.spec_drafts for o in outputs)
    assert proposed == stats.spec_num_draft_tokens == sum(s.spec_proposed for s in steps) > 0
    assert accepted == stats.spec_num_accepted_tokens == sum(s.spec_accepted for s in steps) > 0
    assert drafts == stats.spec_num_drafts
    assert stats.spec_acceptance_rate == pytest.approx(accepted / proposed)
    assert stats.spec_mean_accepted_tokens == pytest.approx(accepted / drafts)
    per_position = stats.spec_accepted_per_position
    assert len(per_position) == 3 and sum(per_position) == accepted
    assert list(per_position) == sorted(per_position, reverse=True), "position j is accepted only after j - 1"
    assert sum(s.num_output_tokens for s in steps) == len(PROMPTS) * MAX_TOKENS
    assert max(s.num_output_tokens - s.spec_accepted for s in steps) <= len(PROMPTS), "one unproposed token each"
    verifying = [s for s in steps if s.spec_proposed]
    assert all(s.spec_acceptance_rate == s.spec_accepted / s.spec_proposed for s in verifying)
    assert max(s.tokens_per_sequence for s in verifying) > 1.0 and min(s.tokens_per_sequence for s in verifying) >= 1
    assert all(o.metrics.spec_accepted <= o.metrics.spec_proposed <= 3 * o.metrics.spec_drafts for o in outputs)


def test_num_speculative_tokens_bounds_proposals(pair):
    target, draft = pair
    _, one = run(target, "draft", draft, num_speculative_tokens=1)
    _, four = run(target, "draft", draft, num_speculative_tokens=4)
    assert one.spec_num_draft_tokens == one.spec_num_drafts
    assert len(one.spec_accepted_per_position) == 1 and len(four.spec_accepted_per_position) == 4
    assert four.spec_num_draft_tokens > 3 * four.spec_num_drafts
    assert four.spec_mean_accepted_tokens > one.spec_mean_accepted_tokens


def test_memory_estimate_includes_the_draft(pair):
    target, draft = pair
    config = EngineConfig(model=target, dtype="float32", speculative="draft", draft_model=draft,
                          kv_cache_bytes=2**20, block_size=8)
    estimate = estimate_memory(config)
    alone = estimate_memory(config.replace(speculative="off", draft_model=None))
    with Engine(config) as engine:
        stats = engine.stats()
    assert estimate.weights_bytes == stats.weights_bytes > alone.weights_bytes
    assert estimate.kv_cache_bytes == stats.kv_cache_bytes <= 2**20
    assert 0 < stats.draft_weights_bytes < stats.weights_bytes - stats.draft_weights_bytes
    assert 0 < stats.draft_kv_cache_bytes < stats.kv_cache_bytes


def test_the_demo_target_takes_its_curated_draft():
    with Engine(EngineConfig(model="demo", speculative="draft")) as engine:
        assert engine.info.draft_model == "demo-draft"
        assert 0 < engine.info.draft_num_params < engine.info.num_params
    assert curated_draft("assets/models/demo-chat") == "demo-draft"


def test_incompatible_drafts_are_refused(pair, tmp_path):
    target, draft = pair
    other_vocab = build_llama(tmp_path / "other-vocab", VOCAB + 16, hidden_size=32, layers=1)
    with pytest.raises(ModelLoadError, match="vocabulary"):
        Engine(EngineConfig(model=target, speculative="draft", draft_model=other_vocab))
    bigger = build_llama(tmp_path / "bigger", VOCAB, hidden_size=128, layers=2)
    with pytest.raises(ModelLoadError, match="not fewer"):
        Engine(EngineConfig(model=target, speculative="draft", draft_model=bigger))
    with pytest.raises(ModelLoadError, match="not fewer"):
        Engine(EngineConfig(model=target, speculative="draft", draft_model=target))


def test_a_draft_with_another_tokenizer_is_refused(tmp_path):
    tokenizer = build_tiny_tokenizer(tmp_path / "target")
    target = build_llama(tmp_path / "target", len(tokenizer))
    draft = build_llama(tmp_path / "draft", len(tokenizer), hidden_size=32, layers=1)
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save_pretrained(tmp_path / "draft")
    with pytest.raises(ModelLoadError, match="tokenizer"):
        Engine(EngineConfig(model=target, speculative="draft", draft_model=draft))


@pytest.mark.parametrize("settings, message", [
    (dict(speculative="draft", model="org/no-curated-draft"), "draft_model"),
    (dict(speculative="ngram", backend="hf"), "native"),
    (dict(speculative="draft", backend="hf"), "native"),
    (dict(speculative="ngram", num_speculative_tokens=17), "at most 16"),
    (dict(speculative="draft", draft_model=""), "draft_model"),
])
def test_impossible_speculative_configs_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(**settings).validate()
