"""The decode path: chunks over a cached prefix, incremental block tables, a pool that is never zero-filled,
no fresh memory per step, the matmul forms, and the pure-PyTorch fallback when the kernels are missing."""

from __future__ import annotations

import gc

import psutil
import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import ConfigError, Engine, EngineConfig, SamplingParams, estimate_memory, unavailable_reason
from engine.backends.native import NativeBackend
from engine.model import cpu_kernels, matmul
from engine.plan import plan_engine
from engine.runner.block_tables import BlockTables
from engine.runner.step_plan import SequenceChunk, StepPlan
from engine.testing import EngineProbe
from tests.support.greedy_reference import MAX_TOKENS, PROMPTS, hf_greedy

MIB = 2**20


def native_backend(folder: str, **settings) -> NativeBackend:
    return NativeBackend(plan_engine(EngineConfig(model=folder, dtype="float32", **settings)))


@pytest.mark.parametrize("settings", [dict(), dict(attention="sdpa"), dict(cpu_kernels=False)])
@pytest.mark.parametrize("arch", ["llama-gqa", "qwen3-qk-norm"])
def test_several_tokens_over_a_cached_prefix_score_like_transformers(arch, settings, tiny_model_dirs):
    """What speculative verification sends: a chunk of several tokens after a cached prefix, each scored."""
    folder = tiny_model_dirs[arch]
    tokens = [int(t) for t in torch.randint(3, 300, (27,), generator=torch.Generator().manual_seed(2))]
    backend = native_backend(folder, block_size=4, **settings)
    try:
        blocks = list(range(7, 0, -1))  # out of order on purpose
        with torch.inference_mode():
            backend.executor.runner.execute(StepPlan([SequenceChunk(tokens[:22], 0, blocks[:6], 0, seq_id=1)]))
            logits = backend.executor.runner.execute(StepPlan([SequenceChunk(tokens[22:], 22, blocks, 5, seq_id=1)]))
    finally:
        backend.close()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = model(torch.tensor([tokens])).logits[0, 22:]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def _score_one_step(folder: str, attention: str, texts: dict, cached: dict, tables: dict):
    """Cache each sequence's first `cached[seq]` tokens, then score the rest of every sequence in one step; returns
    that step's attention metadata, its logits and transformers' logits for the same positions."""
    backend = native_backend(folder, block_size=4, attention=attention)
    try:
        runner = backend.executor.runner
        with torch.inference_mode():
            runner.execute(StepPlan([SequenceChunk(texts[seq][:n], 0, tables[seq][:-(-n // 4)], 0, seq_id=seq)
                                     for seq, n in cached.items()]))
            chunks = [SequenceChunk(text[cached.get(seq, 0):], cached.get(seq, 0), tables[seq],
                                    len(text) - cached.get(seq, 0), seq_id=seq) for seq, text in texts.items()]
            meta = runner.prepare(StepPlan(chunks))[2]
            logits = runner.execute(StepPlan(chunks))
    finally:
        backend.close()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = torch.cat([model(torch.tensor([text])).logits[0, cached.get(seq, 0):]
                              for seq, text in texts.items()])
    return meta, logits, expected


def _random_texts(lengths: dict) -> dict:
    generator = torch.Generator().manual_seed(3)
    return {seq: [int(t) for t in torch.randint(3, 300, (n,), generator=generator)] for seq, n in lengths.items()}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_short_chunks_of_many_sequences_attend_in_one_padded_batch_and_score_like_transformers(attention,
                                                                                               tiny_llama_dir):
    """A speculative verification step of several sequences (chunks of 1 to 6 tokens over cached prefixes of
    different lengths) next to a prompt: the short chunks go through the padded batch (a fixed number of
    operators per layer), the lone prompt through its own span, and every scored position matches transformers."""
    texts = _random_texts({1: 27, 2: 11, 3: 20, 4: 10})
    tables = {1: [30, 2, 17, 5, 9, 11, 40], 2: [3, 21, 8], 3: [12, 13, 14, 15, 16], 4: [25, 1, 33]}
    meta, logits, expected = _score_one_step(tiny_llama_dir, attention, texts, {1: 22, 2: 10, 4: 7}, tables)
    assert [(p.rows, p.query_slots) for p in meta.padded] == [(3, 5)] and len(meta.prefills) == 1
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_prompts_arriving_together_attend_as_a_second_padded_batch_within_its_budget(attention, tiny_llama_dir,
                                                                                      monkeypatch):
    """Two prompts (one fresh, one continuing after a cached chunk) beside a decode token: the prompts form a
    second padded batch, or spans once their mask would outgrow the budget; both score like transformers."""
    from engine.model import attention as attention_module

    texts = _random_texts({1: 23, 2: 37, 3: 9})
    tables = {1: [4, 5, 6, 7, 8, 9], 2: [30, 31, 32, 33, 34, 35, 36, 37, 38, 39], 3: [50, 51, 52]}
    cached = {2: 12, 3: 8}
    meta, logits, expected = _score_one_step(tiny_llama_dir, attention, texts, cached, tables)
    assert [(p.rows, p.query_slots) for p in meta.padded] == [(1, 1), (2, 25)] and not meta.prefills
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    monkeypatch.setattr(attention_module, "PADDED_MASK_BUDGET", 2 * 25 * 40 - 1)
    meta, logits, expected = _score_one_step(tiny_llama_dir, attention, texts, cached, tables)
    assert [(p.rows, p.query_slots) for p in meta.padded] == [(1, 1)] and len(meta.prefills) == 2
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_block_tables_write_only_what_changed():
    tables = BlockTables(max_blocks_per_seq=8, device="cpu")
    first = tables.step_tables([1, 2, 3], [[4, 5], [6], [7, 8, 9]], width=3)
    assert tables.entries_written == 6
    assert first[0, :2].tolist() == [4, 5] and first[2].tolist() == [7, 8, 9]
    tables.step_tables([1, 2, 3], [[4, 5], [6], [7, 8, 9]], width=3)
    assert tables.entries_written == 0  # a decode step inside the same blocks writes nothing
    grown = tables.step_tables([1, 2, 3], [[4, 5], [6, 10], [7, 8, 9]], width=3)
    assert tables.entries_written == 1 and grown[1, :2].tolist() == [6, 10]
    moved = tables.step_tables([3, 1], [[7, 8, 9], [11, 12]], width=3)  # 1 re-admitted elsewhere, 2 gone
    assert tables.entries_written == 2 and moved[1, :2].tolist() == [11, 12] and moved[0].tolist() == [7, 8, 9]
    assert 2 not in tables.rows
    many = tables.step_tables(list(range(100, 120)), [[i] for i in range(20)], width=1)  # rows grow past 8
    assert many[:, 0].tolist() == list(range(20))


@pytest.mark.parametrize("attention", ["cpu-kernel", "sdpa", "eager"])
def test_stale_contents_of_the_never_zeroed_pool_never_reach_outputs(attention, tiny_llama_dir):
    """The pool holds whatever was there before (here NaN everywhere): attention must read only written slots."""
    with Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", attention=attention, block_size=8)) as engine:
        EngineProbe(engine).kv_storage().fill_(float("nan"))
        outputs = engine.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [o.finish_reason for o in outputs] == ["length"] * len(PROMPTS)
    assert [o.token_ids for o in outputs] == hf_greedy(tiny_llama_dir, PROMPTS, MAX_TOKENS)


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_the_kv_pool_is_reserved_not_committed_and_is_returned_on_close(tiny_llama_dir):
    pool = 512 * MIB
    with Engine(EngineConfig(model=tiny_llama_dir, dtype="float32")) as warm:  # imports, allocator arenas
        warm.generate([[5] * 20], SamplingParams(max_tokens=4, ignore_eos=True))
    before = rss()
    engine = Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", kv_cache_bytes=pool))
    engine.generate([[5] * 20] * 4, SamplingParams(max_tokens=8, ignore_eos=True))
    assert engine.stats().kv_cache_bytes == pool
    assert rss() - before < pool // 8, "the pool was committed (zero-filled?) although almost none of it was used"
    engine.close()
    assert rss() - before < 32 * MIB


def test_decode_steps_fault_in_no_fresh_memory():
    """With the pool's pages touched once, a batch-16 decode step of the demo model maps no new memory."""
    with Engine(EngineConfig(model="demo", max_num_seqs=16, kv_cache_bytes=64 * MIB)) as engine:
        # commit the pool now: a first write into a page faults once, whatever the step allocates
        EngineProbe(engine).kv_storage().zero_()
        prompts = [[int(t) for t in torch.randint(3, 6000, (128,), generator=torch.Generator().manual_seed(i))]
                   for i in range(16)]
        engine.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
        steps = EngineProbe(engine).decode_steps()
    full_batch = [step.minor_faults for step in steps if step.batch_size == 16]
    assert len(full_batch) >= 10
    assert sorted(full_batch)[len(full_batch) // 2] < 20


def test_matmul_forms_compute_the_same_product_and_plans_follow_the_setting():
    generator = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 40, generator=generator), torch.randn(96, generator=generator)
    for rows in (1, 5, 8, 9, 40):
        x = torch.randn(rows, 40, generator=generator)
        expected = torch.nn.functional.linear(x, weight, bias)
        for plan in (matmul.MatmulPlan(True, "onednn"), matmul.MatmulPlan(False, "mkl"),
                     matmul.MatmulPlan(True, "mkl"), matmul.MatmulPlan(False, "onednn")):
            torch.testing.assert_close(matmul.linear(plan, x, weight, bias), expected, atol=1e-4, rtol=1e-4)
    assert matmul.plan_matmul(96, 40, torch.float32, "cpu", True).small_batch_kernel
    assert not matmul.plan_matmul(96, 40, torch.float32, "cpu", False).small_batch_kernel
    assert matmul.plan_matmul(96, 40, torch.bfloat16, "cpu", True) == matmul.MatmulPlan(False, "mkl")
    assert matmul.plan_matmul(96, 40, torch.float32, "cpu", True).large in ("onednn", "mkl")


def test_kernel_settings_are_checked_and_resolved(tiny_llama_dir):
    with pytest.raises(ConfigError, match="cpu_kernels"):
        EngineConfig(attention="cpu-kernel", cpu_kernels=False).validate()
    with pytest.raises(ConfigError, match="cpu_kernels must be"):
        EngineConfig(cpu_kernels="yes").validate()
    assert "CPU" in unavailable_reason("attention", "cpu-kernel", device="cuda")
    with Engine(EngineConfig(model=tiny_llama_dir, dtype="float32")) as engine:
        assert engine.info.attention == "cpu-kernel" and engine.info.cpu_kernels
    with Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", cpu_kernels=False)) as engine:
        assert engine.info.attention == "sdpa" and not engine.info.cpu_kernels
        assert not any("kernel" in notice for notice in engine.info.notices)  # off on purpose: nothing to explain
    with Engine(EngineConfig(model=tiny_llama_dir, dtype="bfloat16")) as engine:
        assert engine.info.attention == "sdpa" and not engine.info.cpu_kernels
        assert any("float32" in notice for notice in engine.info.notices)
    with pytest.raises(ConfigError, match="float32"):
        Engine(EngineConfig(model=tiny_llama_dir, dtype="bfloat16", attention="cpu-kernel"))


def test_without_a_kernel_build_the_engine_runs_pure_pytorch_and_says_why(tiny_llama_dir, monkeypatch):
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    with Engine(EngineConfig(model=tiny_llama_dir, dtype="float32")) as engine:
        with_kernels = [o.token_ids for o in engine.generate(PROMPTS, params)]
    monkeypatch.setattr(cpu_kernels, "unavailable_reason", lambda: cpu_kernels.NOT_BUILT)
    with Engine(EngineConfig(model=tiny_llama_dir, dtype="float32")) as engine:
        assert engine.info.attention == "sdpa" and not engine.info.cpu_kernels
        assert any("make kernels" in notice for notice in engine.info.notices)
        assert [o.token_ids for o in engine.generate(PROMPTS, params)] == with_kernels


def test_kv_memory_fraction_sizes_the_default_pool(tiny_llama_dir):
    with pytest.raises(ConfigError, match="kv_memory_fraction"):
        EngineConfig(kv_memory_fraction=1.5).validate()
    config = EngineConfig(model=tiny_llama_dir, dtype="float32", max_model_len=256, kv_memory_fraction=1e-9)
    with Engine(config) as engine:
        stats = engine.stats()
    one_sequence = 256 // stats.kv_block_size
    assert stats.kv_blocks_total == one_sequence  # the budget is tiny: the floor of one full sequence
    assert estimate_memory(config).kv_cache_bytes == stats.kv_cache_bytes


def decode_plan(backend: NativeBackend, prompts: list[list[int]]) -> StepPlan:
    """Prefill `prompts` into fresh blocks, then the plan of one decode step for all of them."""
    manager = backend.block_manager
    chunks = []
    for seq_id, prompt in enumerate(prompts, start=1):
        manager.allocate(seq_id, prompt + [0])
        table = manager.block_table(seq_id)
        backend.executor.runner.execute(StepPlan([SequenceChunk(prompt, 0, list(table), 0, seq_id=seq_id)]))
        chunks.append(SequenceChunk([7 + seq_id], len(prompt), list(table), 1, seq_id=seq_id))
    return StepPlan(chunks)


@pytest.mark.parametrize("quantization", ["none", "native-int8", "native-int4"])
@pytest.mark.parametrize("arch", ["llama-gqa", "qwen2-qkv-bias", "qwen3-qk-norm", "llama-mqa-tied"])
def test_fused_small_batch_decode_computes_what_the_layers_compute(arch, quantization, tiny_model_dirs):
    """Float32 weights on the small-batch kernel, or the engine's packed formats on theirs: the same numbers."""
    backend = native_backend(tiny_model_dirs[arch], block_size=4, quantization=quantization)
    try:
        assert backend.executor.runner.fused_decode is not None
        with torch.inference_mode():
            plan = decode_plan(backend, [PROMPTS[2], PROMPTS[3], PROMPTS[0]])
            fused = backend.executor.runner.execute(plan)
            backend.executor.runner.fused_decode = None
            layered = backend.executor.runner.execute(plan)  # the same step again, layer by layer
    finally:
        backend.close()
    assert torch.equal(fused, layered)


def test_fused_small_step_of_several_tokens_per_sequence_computes_what_the_layers_compute(tiny_llama_dir):
    """A speculative verification's shape (1 + k tokens of one sequence over its cached prefix) and a draft's
    catch-up (2 tokens) in one step of 7 tokens: the fused call, causal within each chunk, equals the layers."""
    backend = native_backend(tiny_llama_dir, block_size=4)
    runner = backend.executor.runner
    try:
        with torch.inference_mode():
            decode = decode_plan(backend, [PROMPTS[2], PROMPTS[3]])
            first, second = decode.chunks
            for chunk, extra in ((first, 4), (second, 1)):
                backend.block_manager.grow(chunk.seq_id, chunk.start + 1 + extra)
            plan = StepPlan([
                SequenceChunk([11, 12, 13, 14, 15], first.start, list(backend.block_manager.block_table(first.seq_id)),
                              5, seq_id=first.seq_id),
                SequenceChunk([21, 22], second.start, list(backend.block_manager.block_table(second.seq_id)), 2,
                              seq_id=second.seq_id)])
            assert runner.fused_decode.applies(runner.prepare(plan)[2].batch)
            fused = runner.execute(plan)
            runner.fused_decode = None
            layered = runner.execute(plan)
    finally:
        backend.close()
    assert fused.shape[0] == 7 and torch.equal(fused, layered)


@pytest.mark.parametrize("settings", [dict(cpu_kernels=False), dict(attention="sdpa"),
                                      dict(quantization="torchao-int8")])
def test_fused_decode_only_where_the_kernels_are_what_the_layers_run(settings, tiny_llama_dir):
    backend = native_backend(tiny_llama_dir, **settings)
    try:
        assert backend.executor.runner.fused_decode is None
    finally:
        backend.close()


def test_more_sequences_than_the_fused_path_takes_still_match_transformers(tiny_llama_dir):
    """Twelve sequences decode together: the layer-by-layer kernel path (the fused one stops at eight)."""
    prompts = [prompt + [9] for prompt in PROMPTS] + [[3 + i] * (5 + i) for i in range(5)]
    with Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", max_num_seqs=16)) as engine:
        outputs = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
        assert max(step.batch_size for step in engine.step_history()) == 12
    assert [o.token_ids for o in outputs] == hf_greedy(tiny_llama_dir, prompts, MAX_TOKENS)
