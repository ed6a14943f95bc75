"""The native backend: our model, KV pool, block manager, scheduler, runner and sampler.

It is built from an `EnginePlan` (`engine/plan.py`), which already resolved everything the model's
own config decides (context length, dtype, the KV pool's size in blocks) and refused impossible
settings before any large allocation. A step is: schedule -> plan (plain data) -> execute (logits) -> sample ->
hand tokens to their requests -> commit computed blocks. A request whose own processing fails
(unusable logits, a detokenizer error) fails alone; the rest of its step carries on.

With speculative decoding (`engine/speculative/`), a step first has the proposer suggest tokens for the
running requests, the scheduler appends them after each request's new token, and the rejection
rule replaces sampling: each request takes its accepted proposals plus one token of the target's.
A draft model runs as a second native model whose KV pool shares the target's block tables.

The target model runs behind an executor (`engine/runner/executor.py`): in this process, sharded
over `tensor_parallel_size` worker processes, or split into `pipeline_parallel_size` stages. The
scheduler, block manager, proposer and sampler stay here either way; with N ranks a block's bytes
are every rank's share of it together.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable

import torch

from engine.backends.base import next_token_log_probs
from engine.core.block_manager import BlockManager
from engine.core.logprobs import LogprobRow, TokenLogprob, token_logprobs
from engine.core.metrics import peak_memory_bytes
from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest, Scheduler
from engine.core.step_timing import StepProfiler
from engine.guided.masks import MaskResult, apply_grammar_masks
from engine.info import EngineStats, StepRecord
from engine.model.attention import make_attention
from engine.model.linear import BuildContext
from engine.model.sampler import SamplingTensors, greedy, sample
from engine.plan import EnginePlan
from engine.quant.storage import parameter_count, weight_storage_bytes
from engine.runner.build import RunnerSettings, build_native_model, meta_model
from engine.runner.cuda_graphs import DecodeGraphs
from engine.runner.executor import Executor, LocalExecutor
from engine.runner.kv_cache import KVCache, bytes_per_block
from engine.runner.model_runner import ModelRunner
from engine.runner.pp_executor import PipelineExecutor, pipeline_micro_batches
from engine.runner.profiler import DecodeProfile, summarize_decode
from engine.runner.step_plan import SequenceChunk, StepPlan, plan_step
from engine.runner.tp_executor import TensorParallelExecutor
from engine.speculative.draft import DraftModelProposer
from engine.speculative.ngram import NgramProposer
from engine.speculative.speculator import Speculator

SCORING_SEQUENCE_ID = -1  # block-manager id of the window `score` runs (request ids are >= 0)

log = logging.getLogger(__name__)


def runner_settings(plan: EnginePlan) -> RunnerSettings:
    """The plain, picklable part of the plan every process that holds a shard builds its runner from."""
    config = plan.config
    return RunnerSettings(str(plan.path), plan.hf_config, plan.spec, config.quantization, plan.dtype, plan.kv_dtype,
                          plan.device, plan.attention, plan.block_size, plan.num_kv_blocks, plan.max_model_len,
                          plan.cuda_graphs, config.max_num_seqs, plan.cpu_kernels)


def make_executor(plan: EnginePlan) -> Executor:
    """The model in this process for one rank, in worker processes for more (ranks or pipeline stages)."""
    settings = runner_settings(plan)
    if plan.config.pipeline_parallel_size > 1:
        config = plan.config
        return PipelineExecutor(settings, config.pipeline_parallel_size, pipeline_micro_batches(config),
                                config.pipeline_schedule)
    if plan.config.tensor_parallel_size == 1:
        return LocalExecutor(settings)
    return TensorParallelExecutor(settings, plan.config.tensor_parallel_size)


def build_draft_runner(plan: EnginePlan) -> ModelRunner:
    """The draft model over its own KV pool: as many blocks as the target's, addressed by the same tables."""
    draft = plan.draft
    build = BuildContext(plan.dtype, plan.device, cpu_kernels=plan.cpu_kernels)
    attention = make_attention(plan.attention, draft.spec.head_dim, plan.block_size)
    model = build_native_model(draft.spec, draft.hf_config, draft.path, build, attention, plan.max_model_len)
    kv_cache = KVCache(draft.spec, plan.num_kv_blocks + int(plan.cuda_graphs), plan.block_size, plan.kv_dtype,
                       plan.device, head_major=plan.attention != "flash-attn")
    graphs = (DecodeGraphs(model, kv_cache.layers, plan.config.max_num_seqs, -(-plan.max_model_len // plan.block_size),
                           plan.num_kv_blocks, plan.block_size, plan.device) if plan.cuda_graphs else None)
    return ModelRunner(model, kv_cache, plan.device, attention, plan.max_model_len, graphs)


class NativeBackend:
    """Steps the native engine: schedule, run the model, sample, hand tokens to their requests."""

    def __init__(self, plan: EnginePlan):
        config = plan.config
        self._take_plan(plan)
        self.kv_block_bytes = plan.kv_block_bytes - (bytes_per_block(plan.draft.spec, plan.block_size, plan.kv_dtype)
                                                     if plan.draft else 0)
        self.block_manager = BlockManager(plan.num_kv_blocks, plan.block_size, config.prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.batching, config.max_num_seqs,
                                   config.max_num_batched_tokens, mirrors_draft_kv=plan.draft is not None)
        self.executor = make_executor(plan)
        self.draft_runner = None
        self.speculator = None
        if plan.draft:
            self.draft_runner = build_draft_runner(plan)
            proposer = DraftModelProposer(self.draft_runner, self.block_manager, self.spec.vocab_size)
            self.speculator = Speculator(proposer, config.num_speculative_tokens, plan.max_model_len)
        elif config.speculative == "ngram":
            self.speculator = Speculator(NgramProposer(), config.num_speculative_tokens, plan.max_model_len)
        self.draft_weights_bytes = weight_storage_bytes(self.draft_runner.model) if self.draft_runner else 0
        self.draft_num_params = parameter_count(self.draft_runner.model) if self.draft_runner else 0
        # Sections are timed on this thread: the model must run here (one process) and synchronously (a CPU).
        self.profiler = StepProfiler(enabled=self.device == "cpu" and isinstance(self.executor, LocalExecutor))

    def _take_plan(self, plan: EnginePlan) -> None:
        """What every native backend keeps of its plan (this one and the disaggregated one): the device, the model's
        shape and parameter count, the block size; the seed set, the step count at zero."""
        self.device = plan.device
        self.spec = plan.spec
        self.block_size = plan.block_size
        self.num_params = parameter_count(meta_model(self.spec, plan.dtype, "none", self.device))
        self.steps = 0
        torch.manual_seed(plan.config.seed)

    def add(self, request: Request) -> None:
        self.scheduler.add(request)

    def abort(self, request: Request) -> None:
        self._remove(request)

    def _remove(self, request: Request) -> None:
        self.scheduler.remove(request)
        if self.speculator:
            self.speculator.release(request)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def requests(self) -> list[Request]:
        return list(self.scheduler.running) + list(self.scheduler.waiting)

    def step(self, record: Callable[[StepRecord], None]) -> None:
        """One engine step. A model failure fails the step's requests; the others keep going."""
        started = time.perf_counter()
        self.profiler.start_step()
        if self.speculator:
            try:
                self.speculator.propose(self.scheduler.running)
            except Exception as error:  # the draft model failed: its K/V is unknown, so its requests fail
                self._fail(list(self.scheduler.running), error)
                return
        proposed = time.perf_counter()
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return
        plan = plan_step(scheduled)
        self.profiler.lap("schedule")
        self._run_and_deliver(scheduled, plan, started, proposed, record, lambda: self.executor.execute(plan))

    def _run_and_deliver(self, scheduled: list[ScheduledRequest], plan: StepPlan, started: float, proposed: float,
                         record: Callable[[StepRecord], None], run: Callable[[], torch.Tensor]) -> None:
        """The rest of a step once its plan is made: `run()` gives the logits (the completing requests' rows, in
        order), then sample, deliver, record, and commit the computed blocks."""
        completing = [item for item in scheduled if item.num_logits]
        try:
            logits = run()
            self.profiler.lap("execute")
            raw, masked = self._apply_grammars(completing, logits)
            self.profiler.lap("guided_mask")
            tokens, valid = self._next_tokens(completing, logits)
            logprobs = self._logprobs(completing, raw, tokens)
            self.profiler.lap("sample")
        except Exception as error:  # e.g. out of memory: report it on these requests, keep serving
            self._fail([item.request for item in scheduled], error)
            return
        now = time.perf_counter()
        proposed_tokens = sum(len(item.speculative_token_ids) for item in completing)
        record(StepRecord(time=now, duration=now - started, batch_size=len(scheduled), num_tokens=plan.num_tokens,
                          num_decode_tokens=len(completing) + proposed_tokens, num_running=len(self.scheduler.running),
                          kv_blocks_used=self.block_manager.num_blocks - self.block_manager.num_free_blocks,
                          num_output_tokens=sum(len(t) for t in tokens), spec_proposed=proposed_tokens,
                          spec_accepted=sum(len(t) - 1 for t in tokens), propose_duration=proposed - started,
                          context_tokens=sum(chunk.end for chunk in plan.chunks),
                          attention_pairs=sum(chunk.attention_pairs for chunk in plan.chunks),
                          guided_mask_duration=masked.seconds if masked else 0.0))
        failed = masked.failed if masked else {}
        try:
            for item, new_tokens, usable, reported in zip(completing, tokens, valid, logprobs, strict=True):
                item.request.hold_final = True  # its end is published once its blocks are free (below)
                if item.request in failed:
                    item.request.finish("error", failed[item.request])
                else:
                    self._deliver(item.request, new_tokens, usable, now, reported)
            # A failed request's K/V may be garbage (NaN scores): never publish its blocks to the prefix cache.
            self.scheduler.complete_step([item for item in scheduled if item.request.finish_reason != "error"])
            for item in scheduled:
                if item.request.finished:
                    self._remove(item.request)
        finally:
            for item in completing:
                item.request.release_final()
        self.steps += 1
        self.profiler.end_step(len(plan.chunks), plan.num_tokens, sum(chunk.end for chunk in plan.chunks))

    def decode_profile(self, since: float = 0.0) -> DecodeProfile | None:
        """The decode steps finished after `since` against their matmul floor (measured now, on this thread);
        None when steps are not profiled (a GPU, or the model in tensor-parallel worker processes)."""
        if not self.profiler.enabled:
            return None
        return summarize_decode(self.profiler.decode_steps(since), self.executor.runner.model)

    def _fail(self, requests: list[Request], error: Exception) -> None:
        log.error("model step failed:\n%s", traceback.format_exc())
        for request in requests:
            self._remove(request)
            request.finish("error", f"{type(error).__name__}: {error}")

    def _next_tokens(self, completing: list[ScheduledRequest], logits: torch.Tensor) -> tuple[list[list[int]],
                                                                                              list[bool]]:
        """The tokens each completing request gets: one sampled, or its verified proposals plus one."""
        if not completing:
            return [], []
        if self.speculator:
            verified = self.speculator.verify(completing, logits)
            return verified.tokens, verified.valid
        rows = [item.request for item in completing]
        if all(r.params.temperature == 0 for r in rows):
            sampled = greedy(logits)
        else:
            sampled = sample(logits, SamplingTensors.build(
                [r.params.temperature for r in rows], [r.params.top_k for r in rows], [r.params.top_p for r in rows],
                [r.seed for r in rows], [len(r.output_token_ids) for r in rows], logits.device))
        return [[token] for token in sampled.tokens.tolist()], sampled.valid.tolist()

    def _apply_grammars(self, completing: list[ScheduledRequest],
                        logits: torch.Tensor) -> tuple[torch.Tensor, MaskResult | None]:
        """Mask the guided rows of `logits` in place; returns the raw logits for log-probabilities (a copy made
        only when a step has both a guided row and a request asking for logprobs) and what masking did."""
        requests = [item.request for item in completing]
        if not any(r.grammar is not None for r in requests):
            return logits, None
        raw = logits.clone() if any(r.params.logprobs is not None for r in requests) else logits
        return raw, apply_grammar_masks(completing, logits)

    @staticmethod
    def _logprobs(completing: list[ScheduledRequest], logits: torch.Tensor,
                  tokens: list[list[int]]) -> list[list[TokenLogprob] | None]:
        """Per completing request, its new tokens' log-probabilities if it asked for them (else None). Token j of a
        request comes from its j-th logits row: the row after its last token, then one per verified proposal."""
        wanted: list[LogprobRow] = []
        row = 0
        for item, new_tokens in zip(completing, tokens, strict=True):
            top = item.request.params.logprobs
            if top is not None:
                wanted += [LogprobRow(row + j, token, top) for j, token in enumerate(new_tokens)]
            row += item.num_logits
        if not wanted:
            return [None] * len(completing)
        values = iter(token_logprobs(logits, wanted))
        return [[next(values) for _ in new_tokens] if item.request.params.logprobs is not None else None
                for item, new_tokens in zip(completing, tokens, strict=True)]

    @staticmethod
    def _deliver(request: Request, tokens: list[int], usable: bool, now: float,
                 logprobs: list[TokenLogprob] | None = None) -> None:
        """Give a request its tokens; a failure here ends this request only."""
        if not usable:
            request.finish("error", "the model produced unusable scores (NaN or infinite logits) for this request")
            return
        try:
            request.append_tokens(tokens, now, logprobs)
        except Exception as error:
            log.error("request %s failed while taking its token:\n%s", request.request_id, traceback.format_exc())
            request.finish("error", f"{type(error).__name__}: {error}")

    def score(self, token_ids: list[int], chunk_tokens: int | None = None) -> torch.Tensor | None:
        """Next-token log-probabilities after each of token_ids[:-1], by one prefill of the whole window, or by
        steps of `chunk_tokens` each attending over the K/V the earlier ones wrote to the pool.

        The window's K/V goes to fresh blocks (never the prefix cache), freed right after; None when
        the running requests hold too many blocks for it now.
        """
        manager = self.block_manager
        if manager.blocks_needed(len(token_ids)) > manager.num_free_blocks:
            return None
        table = manager.allocate_uncached(SCORING_SEQUENCE_ID, len(token_ids))
        step = chunk_tokens or len(token_ids)
        steps = []
        try:
            for start in range(0, len(token_ids), step):
                chunk = list(token_ids[start:start + step])
                steps.append(self.executor.execute(StepPlan([SequenceChunk(chunk, start, table, len(chunk))])))
            logits = torch.cat(steps)
        finally:
            manager.free(SCORING_SEQUENCE_ID)
        return next_token_log_probs(logits[:-1])

    def forget_warm_up(self) -> None:
        self.scheduler.forget_counts()
        self.steps = 0
        if self.speculator:
            self.speculator.forget_stats()

    def stats(self) -> EngineStats:
        """Figures of both KV pools together (a draft's blocks are allocated alongside the target's), with
        the draft's share and the speculative counters broken out."""
        manager = self.block_manager
        used_blocks = manager.num_blocks - manager.num_free_blocks
        draft_kv = self.draft_runner.kv_cache if self.draft_runner else None
        block_bytes = self.kv_block_bytes + (draft_kv.block_bytes if draft_kv else 0)
        draft_kv_bytes = draft_kv.nbytes if draft_kv else 0
        spec = self.speculator.stats if self.speculator else None
        executor = self.executor.stats()
        return EngineStats(
            weights_bytes=sum(executor.rank_weights_bytes) + self.draft_weights_bytes,
            kv_cache_bytes=sum(executor.rank_kv_cache_bytes) + draft_kv_bytes,
            kv_cache_used_bytes=used_blocks * block_bytes, kv_blocks_total=manager.num_blocks,
            kv_blocks_free=manager.num_free_blocks, kv_block_size=self.block_size,
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            peak_running=self.scheduler.peak_running, num_preemptions=self.scheduler.num_preemptions,
            prefix_cache_hit_rate=self.scheduler.prefix_cache_hit_rate,
            spec_acceptance_rate=spec.acceptance_rate if spec else 0.0,
            peak_memory_bytes=peak_memory_bytes(self.device), steps=self.steps,
            spec_num_drafts=spec.num_drafts if spec else 0,
            spec_num_draft_tokens=spec.num_draft_tokens if spec else 0,
            spec_num_accepted_tokens=spec.num_accepted_tokens if spec else 0,
            spec_mean_accepted_tokens=spec.mean_accepted_tokens if spec else 0.0,
            spec_accepted_per_position=tuple(spec.accepted_per_position) if spec else (),
            draft_weights_bytes=self.draft_weights_bytes, draft_kv_cache_bytes=draft_kv_bytes,
            draft_kv_blocks_total=manager.num_blocks if draft_kv else 0,
            draft_kv_blocks_free=manager.num_free_blocks if draft_kv else 0,
            notes=(f"model steps fail: {executor.failure}",) if executor.failure else (),
            tensor_parallel_size=1 if executor.pipeline else executor.size, rank_pids=tuple(executor.rank_pids),
            rank_weights_bytes=tuple(executor.rank_weights_bytes),
            rank_kv_cache_bytes=tuple(executor.rank_kv_cache_bytes), rank_threads=tuple(executor.rank_threads),
            rank_collective_seconds=tuple(executor.rank_collective_seconds),
            executor_seconds=executor.executor_seconds, collective_seconds=executor.collective_seconds,
            collective_share=executor.collective_share,
            pipeline_parallel_size=executor.pipeline.stages if executor.pipeline else 1, pipeline=executor.pipeline)

    def close(self) -> None:
        self.executor.close()
        if self.speculator:
            self.speculator.close()
        self.draft_runner = None
        if self.device == "cuda":
            torch.cuda.empty_cache()
