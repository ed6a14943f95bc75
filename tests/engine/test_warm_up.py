"""The engine's warm-up runs the loaded level's real prefill and decode (so the first reply pays no first calls), its
time is reported apart within the load, and the figures the engine reports afterwards do not count it."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, unavailable_reason
from engine.engine import WARM_UP_DECODE_STEPS

LEVELS = ["none", "native-int8", "int8", "nf4"]  # the engine's own kernels and both bitsandbytes kinds


@pytest.fixture
def warm_up_steps(monkeypatch) -> list:
    """The steps of the warm-up of the engines built in the test, taken just before the engine forgets them."""
    seen = []
    forget = Engine._forget_warm_up

    def keep_then_forget(engine: Engine) -> None:
        seen.extend(engine.step_history())
        forget(engine)

    monkeypatch.setattr(Engine, "_forget_warm_up", keep_then_forget)
    return seen


@pytest.mark.parametrize("level", LEVELS)
def test_the_warm_up_prefills_more_than_one_block_then_decodes_through_the_loaded_level(tiny_llama_dir, level,
                                                                                       warm_up_steps):
    reason = unavailable_reason("quantization", level)
    if reason:
        pytest.skip(reason)
    with Engine(EngineConfig(model=tiny_llama_dir, quantization=level, kv_cache_bytes=2**22)) as engine:
        prefill, *decode = warm_up_steps
        assert prefill.num_tokens > 2 * engine.config.block_size, "the warm-up prompt did not span two KV blocks"
        assert [step.num_tokens for step in decode] == [1] * (WARM_UP_DECODE_STEPS - 1), "no decode steps"
        assert 0 < engine.info.warmup_seconds < engine.info.load_seconds
        stats = engine.stats()
        assert (stats.steps, stats.peak_running, engine.step_history()) == (0, 0, []), "the warm-up was counted"


def test_a_short_context_shrinks_the_warm_up_to_fit(tiny_llama_dir, warm_up_steps):
    with Engine(EngineConfig(model=tiny_llama_dir, max_model_len=6, kv_cache_bytes=2**22)):
        assert [step.num_tokens for step in warm_up_steps] == [3, 1]  # a 3-token prompt, 2 tokens out


def test_speculative_counts_start_after_the_warm_up(tiny_llama_dir):
    with Engine(EngineConfig(model=tiny_llama_dir, speculative="ngram", kv_cache_bytes=2**22)) as engine:
        stats = engine.stats()
        assert (stats.spec_num_drafts, stats.spec_num_draft_tokens, stats.prefix_cache_hit_rate) == (0, 0, 0.0)
