"""One pipeline stage process: a contiguous range of decoder layers, their part of the KV pool, and its hand-overs.

`PipelineExecutor` starts N of these through a `WorkerGang` (heartbeats, fatal errors and a clean
exit are `worker_process.py`'s). Stage k holds decoder layers [a_k, b_k) (split as evenly as
possible, earlier stages taking the remainder); stage 0 also the embeddings, the last stage the
final norm and the LM head (and, with tied embeddings, the embedding matrix it shares). Only those
tensors are read from the checkpoint. Its KV pool has the engine's number of blocks but only its
own layers, so the block tables the engine's one BlockManager hands out are valid on every stage.

Every stage takes each micro-batch's `StepPlan` from the engine over its own pipe (plain data, in
the same order on every stage). Stage 0 embeds the tokens; every other stage receives the hidden
states [tokens, hidden] from the stage before, runs its layers, and hands the result on through a
sender thread (so it can start on the next micro-batch while the next stage takes this one); the
last stage sends the logits back over its pipe the same way. On a CPU hidden states travel over a
one-way OS pipe between neighbours, on GPUs over NCCL point-to-point (see `PipelineStage`). Each
stage times its own work (busy: from having its input to handing on its output) and forwards
those spans with the hidden states, so the engine gets every stage's spans of a micro-batch with
its logits, on one clock (CLOCK_MONOTONIC is system-wide).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from engine.core.metrics import peak_memory_bytes
from engine.model.attention import make_attention
from engine.model.linear import BuildContext
from engine.model.llama import LlamaForCausalLM
from engine.model.rotary import rope_cos_sin
from engine.model.weights import load_weights
from engine.quant.methods import linear_method_factory, lm_head_method_factory
from engine.quant.storage import weight_storage_bytes
from engine.runner.block_tables import BlockTables
from engine.runner.build import RunnerSettings
from engine.runner.kv_cache import KVCache
from engine.runner.model_runner import ModelRunner
from engine.runner.step_plan import StepPlan
from engine.runner.worker_process import STOP, join_default_group, run_worker_process

SPAN_FIELDS = 3  # start, end, bytes sent on: what each stage adds to a micro-batch's timing record


# A decode step's LM head took about half the time its weights alone suggest, measured against a decoder layer (which
# also runs attention, norms, RoPE and more kernel calls per weight): random-llama-20m on a CPU, a head with 1.45
# layers' weights took 0.6 of a layer's time (stage busy times of engine.tools.pipeline_bubbles).
HEAD_TIME_PER_WEIGHT = 0.5


def head_cost_in_layers(spec) -> float:
    """The LM head's time in a decode step as a number of decoder layers: its weights over a layer's, discounted by
    `HEAD_TIME_PER_WEIGHT` (both scale with the tokens a step scores)."""
    q = spec.num_heads * spec.head_dim
    kv = spec.num_kv_heads * spec.head_dim
    layer = spec.hidden_size * (q + 2 * kv) + q * spec.hidden_size + 3 * spec.hidden_size * spec.intermediate_size
    return HEAD_TIME_PER_WEIGHT * spec.vocab_size * spec.hidden_size / layer


def _even(count: int, parts: int, start: int = 0) -> list[tuple[int, int]]:
    base, extra = divmod(count, parts)
    ranges = []
    for part in range(parts):
        stop = start + base + (part < extra)
        ranges.append((start, stop))
        start = stop
    return ranges


def stage_layers(num_layers: int, stages: int, head_cost: float = 0.0) -> list[tuple[int, int]]:
    """[start, stop) of each stage's decoder layers: contiguous, at least one each, such that the most loaded stage
    has as little work as possible when the last stage also computes the LM head (`head_cost` layers' worth).

    The smallest feasible bound on a stage's work is found among the values a stage can have; the last stage then
    takes as many layers as fit under it (at least one), and the others share the rest evenly, earlier ones taking
    any remainder. With no head cost the sizes differ by at most one."""
    if stages == 1:
        return [(0, num_layers)]

    def last_size(bound: float) -> int:
        return min(int(bound - head_cost + 1e-9), num_layers - stages + 1)

    def feasible(bound: float) -> bool:
        last = last_size(bound)
        return last >= 1 and num_layers - last <= (stages - 1) * int(bound + 1e-9)

    candidates = sorted({float(size) for size in range(1, num_layers + 1)}
                        | {size + head_cost for size in range(1, num_layers + 1)})
    bound = next(value for value in candidates if feasible(value))
    last = last_size(bound)
    return _even(num_layers - last, stages - 1) + [(num_layers - last, num_layers)]


@dataclass(frozen=True)
class StageSpec:
    """Who this stage is, which layers it holds and where to meet its peers."""

    stage: int
    size: int
    layers: tuple[int, int]
    store_port: int
    threads: int
    parent_pid: int
    settings: RunnerSettings
    link_in: object = None   # receiving end of the pipe from the previous stage (None on the first)
    link_out: object = None  # sending end of the pipe to the next stage (None on the last)

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.size - 1


def build_stage_model(spec: StageSpec) -> LlamaForCausalLM:
    """This stage's part of the model, loaded: its layers (renumbered from 0), and the ends it holds.

    The model is built with only this stage's layers; the embedding, final norm and LM head are built
    and then dropped where the stage does not use them (a transient cost of two vocabulary-sized
    matrices on middle stages); checkpoint tensors of other stages are skipped, never read.
    """
    settings = spec.settings
    start, stop = spec.layers
    keep_embedding = spec.first or (spec.last and settings.spec.tie_word_embeddings)
    attention = make_attention(settings.attention, settings.spec.head_dim, settings.block_size)
    build = BuildContext(settings.dtype, settings.device,
                         linear_method=linear_method_factory(settings.quantization, settings.device, settings.dtype),
                         lm_head_method=lm_head_method_factory(settings.quantization),
                         cpu_kernels=settings.cpu_kernels)
    cos, sin = rope_cos_sin(settings.hf_config, settings.max_model_len)
    model = LlamaForCausalLM(settings.spec.replace(num_layers=stop - start), attention, build, cos, sin)
    if not keep_embedding:
        model.model.embed_tokens = None
    if not spec.last:
        model.model.norm = None
        model.lm_head = None

    def rename(name: str) -> str | None:
        if name.startswith("model.layers."):
            index, rest = name[len("model.layers."):].split(".", 1)
            return f"model.layers.{int(index) - start}.{rest}" if start <= int(index) < stop else None
        if name.startswith("model.embed_tokens."):
            return name if keep_embedding else None
        if name.startswith(("model.norm.", "lm_head.")):
            return name if spec.last else None
        return name

    load_weights(model, Path(settings.path), rename)
    return model.eval()


class StageRunner(ModelRunner):
    """A `ModelRunner` over one stage's layers: the same step preparation (positions, slots, block tables),
    then embeddings (first stage) or the received hidden states, the stage's layers, and hidden states out
    (or, on the last stage, the final norm and the scored positions' logits). No fused decode or CUDA graphs:
    those run every layer of the model in one call."""

    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, settings: RunnerSettings, first: bool,
                 last: bool):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.device = settings.device
        self.attention = model.model.layers[0].self_attn.attention
        self.decode_graphs = None
        self.fused_decode = None
        self.block_tables = BlockTables(-(-settings.max_model_len // self.block_size), settings.device)
        self.first = first
        self.last = last

    @torch.inference_mode()
    def run_stage(self, plan: StepPlan, hidden: torch.Tensor | None) -> torch.Tensor:
        """Hidden states [tokens, hidden] out of this stage's layers, or on the last stage float32 logits."""
        input_ids, positions, meta, logit_rows = self.prepare(plan)
        model = self.model
        if self.first:
            hidden = model.model.embed_tokens(input_ids)
        cos = model.rope_cos[positions].to(hidden.dtype).unsqueeze(1)
        sin = model.rope_sin[positions].to(hidden.dtype).unsqueeze(1)
        for layer, (k_cache, v_cache) in zip(model.model.layers, self.kv_cache.layers, strict=True):
            hidden = layer(hidden, cos, sin, k_cache, v_cache, meta)
        if not self.last:
            return hidden
        hidden = model.model.norm(hidden)
        if logit_rows is not None:
            hidden = hidden.index_select(0, logit_rows)
        return model.compute_logits(hidden)


class Outbox:
    """A thread that sends messages over one connection, in order, so that the stage never waits for the reader:
    a message larger than the pipe's buffer (a micro-batch's logits, or a prefill's hidden states) is only taken
    as fast as the other side reads, and the other side reads only once it is done with the micro-batch before."""

    def __init__(self, connection, name: str):
        self.connection = connection
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (message := self.queue.get()) is not None:
            try:
                self.connection.send(message)
            except OSError:  # the reader is gone: the engine (or the supervisor) is ending this process
                os._exit(1)

    def put(self, message) -> None:
        self.queue.put(message)

    def close(self) -> None:
        """Send what is queued, then stop."""
        self.queue.put(None)
        self.thread.join()


class PipelineStage:
    """Joins the process group, builds this stage's layers and KV pool, then runs micro-batches until told to stop.

    Hand-overs: each micro-batch's timing record (and on a CPU its hidden states) goes to the next stage over a
    one-way OS pipe between the two (`link_in` / `link_out`); on GPUs the hidden states go over NCCL point-to-point
    (torch.distributed). Gloo's point-to-point was measured at 3.5 ms per round trip of 16 KiB on this 2-core
    machine against 0.1 ms for a pipe, which for a decode micro-batch of a few ms was most of the bubble.
    """

    def __init__(self, spec: StageSpec, command, counters: dict):
        self.spec = spec
        self.command = command
        self.counters = counters
        counters.update(busy_seconds=0.0, wait_seconds=0.0, micro_batches=0, bytes_sent=0, peak_memory_bytes=0)
        settings = spec.settings
        self.cuda = settings.device == "cuda"
        torch.set_num_threads(spec.threads)
        if self.cuda:
            torch.cuda.set_device(spec.stage)
        join_default_group(spec.store_port, spec.stage, spec.size)
        self.nccl = dist.new_group(backend="nccl") if self.cuda else None
        model = build_stage_model(spec)
        stage_spec = settings.spec.replace(num_layers=spec.layers[1] - spec.layers[0])
        kv_cache = KVCache(stage_spec, settings.num_blocks, settings.block_size, settings.kv_dtype, settings.device,
                           head_major=settings.attention != "flash-attn")
        self.runner = StageRunner(model, kv_cache, settings, spec.first, spec.last)
        self.hidden_size = settings.spec.hidden_size
        self.outbox = Outbox(command if spec.last else spec.link_out, f"stage-{spec.stage}-sender")

    def describe(self) -> dict:
        return {"weights_bytes": weight_storage_bytes(self.runner.model), "kv_cache_bytes": self.runner.kv_cache.nbytes,
                "threads": torch.get_num_threads(), "layers": self.spec.layers}

    def _receive(self, ticket: int, plan: StepPlan) -> tuple[torch.Tensor | None, list[float]]:
        """The previous stage's hidden states for micro-batch `ticket` and the timing record of the stages before."""
        if self.spec.first:
            return None, []
        sent_ticket, hidden, spans = self.spec.link_in.recv()
        if sent_ticket != ticket:
            raise RuntimeError(f"pipeline stage {self.spec.stage} expected micro-batch {ticket}, got {sent_ticket}")
        if self.cuda:
            hidden = torch.empty((plan.num_tokens, self.hidden_size), dtype=self.spec.settings.dtype, device="cuda")
            dist.recv(hidden, src=self.spec.stage - 1, group=self.nccl)
        else:
            hidden = torch.from_numpy(hidden)
        return hidden, spans

    def _send_on(self, ticket: int, hidden: torch.Tensor, spans: list[float]) -> None:
        if self.cuda:
            dist.send(hidden, dst=self.spec.stage + 1, group=self.nccl)
            self.outbox.put((ticket, None, spans))
        else:
            self.outbox.put((ticket, hidden.numpy(), spans))

    def serve(self) -> None:
        while True:
            waited = time.monotonic()
            kind, body = self.command.recv()
            if kind == STOP:
                break
            ticket, plan = body
            hidden, spans = self._receive(ticket, plan)
            started = time.monotonic()
            out = self.runner.run_stage(plan, hidden)
            if self.cuda:
                torch.cuda.synchronize()
            sent = 0 if self.spec.last else out.numel() * out.element_size() + (len(spans) + SPAN_FIELDS) * 8
            ended = time.monotonic()
            spans = [*spans, started, ended, float(sent)]
            if self.spec.last:
                self.outbox.put(("logits", ticket, out.cpu().numpy(), spans))
            else:
                self._send_on(ticket, out, spans)
            self.counters.update(busy_seconds=self.counters["busy_seconds"] + ended - started,
                                 wait_seconds=self.counters["wait_seconds"] + started - waited,
                                 micro_batches=self.counters["micro_batches"] + 1,
                                 bytes_sent=self.counters["bytes_sent"] + sent,
                                 peak_memory_bytes=peak_memory_bytes(self.spec.settings.device))
        self.outbox.close()


def run_stage(spec: StageSpec, command, status) -> None:
    """The stage process's entry point (spawned)."""
    run_worker_process(PipelineStage, spec, command, status)
