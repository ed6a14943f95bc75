"""`disaggregation = "prefill-decode"`: prompts are prefilled by one worker process and decoded by another.

Two worker processes (runner/disagg_worker.py), each with a whole model and its own KV pool, are
supervised by one `WorkerGang` (heartbeats, root-cause failure, clean exit). This process keeps
one block manager and one scheduler per side and routes requests between them:

- the prefill side (prefix caching as configured) runs only prompt chunks, under
  `max_num_batched_tokens` (chunked prefill). When a request's last chunk comes back, its first
  token is sampled here from the prefill worker's logits; if it goes on, it waits for room on the
  decode side, then its K/V blocks move: the engine tells the prefill worker "send blocks [..]"
  and the decode worker "receive into blocks [..]" (a gloo `isend`/`recv` between the workers;
  the prefill worker copies the blocks out before answering, so it never waits for the decode
  worker). The prefill-side blocks are then freed: full blocks it published stay findable in the
  prefix cache, as the block manager keeps them;
- the decode side never admits a prompt: requests join it only with their K/V, and it runs one
  token per request per step. A decode request preempted for lack of blocks loses its decode
  blocks and goes back to the front of the prefill queue, to be recomputed there (its prompt's
  prefix may still be cached on the prefill side).

Decode never waits for a prefill: `step()` submits a decode step to the decode worker and a prompt
chunk to the prefill worker whenever each is idle, then processes whichever answer comes first
(`WorkerGang.receive`), so a long prompt never sits between two decode steps. Transfers are
issued only while the prefill worker is idle, so the decode worker's receive never waits behind a
prompt chunk. Every command on one pipe runs in order, so a block freed here (a cancelled request,
a preempted one) can only be written again by a later command, after the in-flight one that uses
it: cancellation frees blocks on whichever side holds them at once, and the in-flight answer that
still names the request is ignored.

Not supported here: speculative decoding, tensor/pipeline parallelism and the hf backend (refused by
the config), and static batching (refused too: both sides batch continuously); scoring runs on the
prefill worker.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.backends.native import NativeBackend, runner_settings
from engine.core.block_manager import BlockManager
from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest, Scheduler
from engine.info import EngineStats, StepRecord
from engine.plan import EnginePlan
from engine.runner.disagg_worker import DECODE_RANK, PREFILL_RANK, RECV_KV, SEND_KV, DisaggWorkerSpec, run_disagg_worker
from engine.runner.step_plan import SequenceChunk, StepPlan, plan_step
from engine.runner.worker_gang import WorkerFailure, WorkerGang
from engine.runner.worker_process import STEP

WORKER_NAMES = ("prefill worker", "decode worker")


class DecodeScheduler(Scheduler):
    """The decode side: schedules its running requests one token each and never admits a prompt. Requests join
    with their K/V (`join`); those it preempts collect in `waiting`, for the backend to send back to prefill."""

    def _admit(self, budget: int, scheduled: list[ScheduledRequest]) -> None:
        return

    def join(self, request: Request) -> None:
        self.running.append(request)
        self.peak_running = max(self.peak_running, len(self.running))

    def take_preempted(self) -> list[Request]:
        preempted = list(self.waiting)
        self.waiting.clear()
        return preempted


@dataclass
class TransferFigures:
    """KV transfers from the prefill worker to the decode worker: counts, bytes, and the workers' seconds (the
    sender's copy out of its pool plus the receiver's receive and copy into its pool)."""

    count: int = 0
    bytes: int = 0
    seconds: float = 0.0
    blocks: int = 0
    requests: set = field(default_factory=set)


class DisaggregatedBackend(NativeBackend):
    """Routes requests between a prefill worker and a decode worker; samples here. Reuses the native backend's
    sampling, grammar, log-probability and delivery helpers (no speculation); every entry point the engine calls
    (add, abort, has_work, requests, step, score, stats, forget_warm_up, decode_profile, close) is its own."""

    def __init__(self, plan: EnginePlan):
        config = plan.config
        self._take_plan(plan)
        self.kv_block_bytes = plan.kv_block_bytes
        # Each worker gets a pool of the plan's size: the configured KV budget is per worker (plan.py counts both).
        self.prefill_blocks = BlockManager(plan.num_kv_blocks, plan.block_size, config.prefix_caching)
        self.decode_blocks = BlockManager(plan.num_kv_blocks, plan.block_size, False)
        self.prefill = Scheduler(self.prefill_blocks, "continuous", config.max_num_seqs, config.max_num_batched_tokens)
        self.decode = DecodeScheduler(self.decode_blocks, "continuous", config.max_num_seqs,
                                      config.max_num_batched_tokens)
        self.block_manager, self.scheduler = self.prefill_blocks, self.prefill  # what NativeBackend's helpers read
        self.speculator = None
        self.draft_runner = None
        self.draft_weights_bytes = self.draft_num_params = 0
        self.profiler = None
        settings = runner_settings(plan)
        threads = max(1, torch.get_num_threads() // 2)
        self.gang = WorkerGang(f"disaggregation={config.disaggregation}", list(WORKER_NAMES),
                               lambda rank, port, parent: DisaggWorkerSpec(rank, port, threads, parent, settings),
                               run_disagg_worker, {PREFILL_RANK, DECODE_RANK})
        self.in_flight: list[tuple[float, list[ScheduledRequest]] | None] = [None, None]
        self.outstanding = [0, 0]  # commands sent to each worker whose answers were not read yet
        self.awaiting_transfer: deque[Request] = deque()  # prefilled, first token sampled, no decode room yet
        self.next_transfer_id = 0
        self.transfer_started: dict[int, tuple[Request, int]] = {}  # transfer id -> (request, answers due)
        self.worker_counters: list[dict] = [{}, {}]
        self._forget()

    def _forget(self) -> None:
        self.transfers = TransferFigures()
        self.request_transfers: dict[int, tuple[int, float]] = {}  # request id -> (bytes, seconds) over its moves
        self.busy_baseline = [self._busy(0), self._busy(1)]
        self.first_step: float | None = None
        self.worker_steps = [0, 0]

    # ---- requests ----------------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        self.prefill.add(request)

    def abort(self, request: Request) -> None:
        self._remove(request)

    def _remove(self, request: Request) -> None:
        """Free what the request holds on either side (its in-flight answer, if any, is ignored when it comes)."""
        if request in self.prefill.running or request in self.prefill.waiting:
            self.prefill.remove(request)
        elif request in self.awaiting_transfer:
            self.awaiting_transfer.remove(request)
            self.prefill_blocks.free(request.request_id)
        elif request in self.decode.running:
            self.decode.remove(request)

    def has_work(self) -> bool:
        return bool(self.prefill.has_work() or self.decode.has_work() or self.awaiting_transfer
                    or any(self.outstanding))

    def requests(self) -> list[Request]:
        return (list(self.decode.running) + list(self.awaiting_transfer) + list(self.prefill.running)
                + list(self.prefill.waiting))

    # ---- stepping ----------------------------------------------------------------------------------

    def step(self, record: Callable[[StepRecord], None]) -> None:
        """Keep both workers busy, then process whichever answer comes first (one step's or one transfer's).
        A lost worker raises WorkerFailure (the engine fails the requests); nothing is in flight after that."""
        try:
            self._step(record)
        except WorkerFailure:
            self.in_flight = [None, None]
            self.outstanding = [0, 0]
            raise

    def _step(self, record: Callable[[StepRecord], None]) -> None:
        self._submit()
        waiting_on = [index for index in (PREFILL_RANK, DECODE_RANK) if self.outstanding[index]]
        if not waiting_on:
            return
        index, reply = self.gang.receive(waiting_on)
        self.outstanding[index] -= 1
        kind = reply[0]
        self.worker_counters[index] = reply[-1]
        if kind == "logits":
            started, scheduled = self.in_flight[index]
            self.in_flight[index] = None
            self._complete(index, started, scheduled, torch.from_numpy(reply[1]), record)
        else:
            _, transfer_id, nbytes, seconds, _ = reply
            self.transfers.seconds += seconds
            request, answers = self.transfer_started[transfer_id]  # both workers answer, in either order
            if answers == 1:
                del self.transfer_started[transfer_id]
            else:
                self.transfer_started[transfer_id] = (request, answers - 1)
            moved = self.request_transfers.get(request.request_id, (0, 0.0))
            if kind == "kv_received":
                self.transfers.count += 1
                self.transfers.bytes += nbytes
                moved = (moved[0] + nbytes, moved[1])
            self.request_transfers[request.request_id] = (moved[0], moved[1] + seconds)
            request.kv_transfer_bytes, request.kv_transfer_s = self.request_transfers[request.request_id]

    def _send(self, index: int, message) -> None:
        self.gang.send(index, message)
        self.outstanding[index] += 1

    def _submit(self) -> None:
        if self.first_step is None:
            self.first_step = time.perf_counter()
        if self.in_flight[PREFILL_RANK] is None and self.outstanding[PREFILL_RANK] == 0:
            self._start_transfers()
            scheduled = self.prefill.schedule()
            if scheduled:
                self._send(PREFILL_RANK, (STEP, plan_step(scheduled)))
                self.in_flight[PREFILL_RANK] = (time.perf_counter(), scheduled)
        if self.in_flight[DECODE_RANK] is None:
            scheduled = self.decode.schedule()
            for request in reversed(self.decode.take_preempted()):  # recomputed through the prefill worker
                self.prefill.waiting.appendleft(request)
            if scheduled:
                self._send(DECODE_RANK, (STEP, plan_step(scheduled)))
                self.in_flight[DECODE_RANK] = (time.perf_counter(), scheduled)

    def _start_transfers(self) -> None:
        """Move prefilled requests to the decode side while it has room (a sequence slot and blocks for its K/V)."""
        while self.awaiting_transfer and len(self.decode.running) < self.decode.max_num_seqs:
            request = self.awaiting_transfer[0]
            computed = request.num_computed_tokens
            # Room for its next token too, and (when others run) one spare block per running request, so that a
            # move does not force a preemption on the very next decode step.
            spare = len(self.decode.running)
            if self.decode_blocks.blocks_needed(computed + 1) > self.decode_blocks.num_free_blocks - spare:
                break
            self.awaiting_transfer.popleft()
            source = list(self.prefill_blocks.block_table(request.request_id))[:self.prefill_blocks.blocks_needed(
                computed)]
            destination = self.decode_blocks.allocate_uncached(request.request_id, computed)
            transfer_id = self.next_transfer_id
            self.next_transfer_id += 1
            self.transfer_started[transfer_id] = (request, 2)
            self._send(PREFILL_RANK, (SEND_KV, (transfer_id, source)))
            self._send(DECODE_RANK, (RECV_KV, (transfer_id, list(destination))))
            self.transfers.blocks += len(source)
            self.transfers.requests.add(request.request_id)
            self.prefill_blocks.free(request.request_id)  # the prefill worker copies them out before any later write
            self.decode.join(request)

    def _complete(self, index: int, started: float, scheduled: list[ScheduledRequest], logits: torch.Tensor,
                  record: Callable[[StepRecord], None]) -> None:
        """Sample and deliver one worker's step; on the prefill side, finished prompts move towards decode."""
        scheduler = self.prefill if index == PREFILL_RANK else self.decode
        rows, row = [], 0
        live, completing = [], []
        for item in scheduled:
            alive = item.request in scheduler.running and not item.request.finished
            if alive:
                live.append(item)
            if item.num_logits:
                if alive:
                    completing.append(item)
                    rows.extend(range(row, row + item.num_logits))
                row += item.num_logits
        self.worker_steps[index] += 1
        if not live:  # every request of this step was cancelled meanwhile
            return
        logits = logits[rows] if len(rows) != logits.shape[0] else logits
        try:
            raw, masked = self._apply_grammars(completing, logits)
            tokens, valid = self._next_tokens(completing, logits)
            logprobs = self._logprobs(completing, raw, tokens)
        except Exception as error:
            self._fail([item.request for item in live], error)
            return
        now = time.perf_counter()
        manager = self.prefill_blocks if index == PREFILL_RANK else self.decode_blocks
        plan_chunks = [SequenceChunk([0] * item.num_new_tokens, item.request.num_computed_tokens, [], item.num_logits)
                       for item in live]
        record(StepRecord(time=now, duration=now - started, batch_size=len(live),
                          num_tokens=sum(item.num_new_tokens for item in live),
                          num_decode_tokens=len(completing) if index == DECODE_RANK else 0,
                          num_running=len(self.decode.running) + len(self.prefill.running),
                          kv_blocks_used=manager.num_blocks - manager.num_free_blocks,
                          num_output_tokens=sum(len(t) for t in tokens),
                          context_tokens=sum(chunk.end for chunk in plan_chunks),
                          attention_pairs=sum(chunk.attention_pairs for chunk in plan_chunks),
                          guided_mask_duration=masked.seconds if masked else 0.0))
        failed = masked.failed if masked else {}
        try:
            for item, new_tokens, usable, reported in zip(completing, tokens, valid, logprobs, strict=True):
                item.request.hold_final = True
                if item.request in failed:
                    item.request.finish("error", failed[item.request])
                else:
                    self._deliver(item.request, new_tokens, usable, now, reported)
            scheduler.complete_step([item for item in live if item.request.finish_reason != "error"])
            for item in live:
                if item.request.finished:
                    self._remove(item.request)
                elif index == PREFILL_RANK and item.completes_sequence:
                    self.prefill.running.remove(item.request)  # keeps its prefill blocks until its K/V moved
                    self.awaiting_transfer.append(item.request)
        finally:
            for item in completing:
                item.request.release_final()
        self.steps += 1

    # ---- scoring (perplexity) on the prefill worker --------------------------------------------------

    def score(self, token_ids: list[int], chunk_tokens: int | None = None) -> torch.Tensor | None:
        """As the native backend's, on the prefill worker's pool, when that worker is idle (else None: ask again)."""
        if self.outstanding[PREFILL_RANK]:
            return None
        manager = self.prefill_blocks
        if manager.blocks_needed(len(token_ids)) > manager.num_free_blocks:
            return None
        table = manager.allocate_uncached(-1, len(token_ids))
        step = chunk_tokens or len(token_ids)
        steps = []
        try:
            for start in range(0, len(token_ids), step):
                chunk = list(token_ids[start:start + step])
                self.gang.send(PREFILL_RANK, (STEP, StepPlan([SequenceChunk(chunk, start, table, len(chunk))])))
                _, reply = self.gang.receive([PREFILL_RANK])
                steps.append(torch.from_numpy(reply[1]))
            logits = torch.cat(steps)
        finally:
            manager.free(-1)
        from engine.backends.base import next_token_log_probs

        return next_token_log_probs(logits[:-1])

    def decode_profile(self, since: float = 0.0):
        return None

    # ---- figures and shutdown ------------------------------------------------------------------------

    def forget_warm_up(self) -> None:
        self.prefill.forget_counts()
        self.decode.forget_counts()
        self.steps = 0
        self._forget()

    def _counters(self, index: int) -> dict:
        """A worker's counters: from its latest answer, or its heartbeat when that is newer."""
        answered = self.worker_counters[index]
        beat = self.gang.counters()[index] if self.gang.failure is None else {}
        return max((answered, beat), key=lambda c: c.get("steps", 0) + c.get("transfer_seconds", 0.0))

    def _busy(self, index: int) -> float:
        counters = self._counters(index)
        return counters.get("execute_seconds", 0.0) + counters.get("transfer_seconds", 0.0)

    def stats(self) -> EngineStats:
        """Both pools together in the KV figures (blocks and bytes), each worker's share broken out."""
        infos = self.gang.infos()
        prefill, decode = self.prefill_blocks, self.decode_blocks
        used = (prefill.num_blocks - prefill.num_free_blocks) + (decode.num_blocks - decode.num_free_blocks)
        wall = time.perf_counter() - self.first_step if self.first_step is not None else 0.0
        busy = tuple(max(0.0, self._busy(i) - self.busy_baseline[i]) for i in (0, 1))
        figures = self.transfers
        moved = len(self.request_transfers)
        counters = [self._counters(i) for i in (0, 1)]
        return EngineStats(
            weights_bytes=sum(info.get("weights_bytes", 0) for info in infos),
            kv_cache_bytes=sum(info.get("kv_cache_bytes", 0) for info in infos),
            kv_cache_used_bytes=used * self.kv_block_bytes, kv_blocks_total=prefill.num_blocks + decode.num_blocks,
            kv_blocks_free=prefill.num_free_blocks + decode.num_free_blocks, kv_block_size=self.block_size,
            num_running=len(self.decode.running) + len(self.prefill.running) + len(self.awaiting_transfer),
            num_waiting=len(self.prefill.waiting),
            peak_running=self.prefill.peak_running + self.decode.peak_running,
            num_preemptions=self.prefill.num_preemptions + self.decode.num_preemptions,
            prefix_cache_hit_rate=self.prefill.prefix_cache_hit_rate, steps=self.steps,
            notes=(f"model steps fail: {self.gang.failure}",) if self.gang.failure else (),
            rank_pids=tuple(self.gang.pids), rank_weights_bytes=tuple(i.get("weights_bytes", 0) for i in infos),
            rank_kv_cache_bytes=tuple(i.get("kv_cache_bytes", 0) for i in infos),
            rank_threads=tuple(i.get("threads", 0) for i in infos), executor_seconds=sum(busy),
            disaggregation="prefill-decode", worker_roles=WORKER_NAMES, worker_busy_seconds=busy,
            worker_utilisation=tuple(b / wall if wall else 0.0 for b in busy),
            worker_steps=tuple(self.worker_steps),
            worker_prefill_chunks=tuple(c.get("prefill_chunks", 0) for c in counters),
            worker_decode_rows=tuple(c.get("decode_rows", 0) for c in counters),
            worker_requests=(len(self.prefill.running) + len(self.prefill.waiting) + len(self.awaiting_transfer),
                             len(self.decode.running)),
            kv_transfers=figures.count, kv_transfer_bytes=figures.bytes, kv_transfer_blocks=figures.blocks,
            kv_transfer_seconds=figures.seconds,
            kv_transfer_bytes_per_request=figures.bytes / moved if moved else 0.0,
            kv_transfer_seconds_per_request=figures.seconds / moved if moved else 0.0,
            decode_kv_blocks_total=decode.num_blocks, decode_kv_blocks_free=decode.num_free_blocks)

    def close(self) -> None:
        self.gang.close()
