"""ZeroGPU mode: engine work runs inside a GPU acquisition (`spaces.GPU`), one call per reply or measurement.

Why: a ZeroGPU Space attaches a GPU slice only while a function decorated with `spaces.GPU` runs, in a worker forked
from the server that receives its arguments and returns its results (or each yield) pickled through queues. Nothing
of a call survives it for certain (a worker may be reused, nothing guarantees it), and the server's own process must
never touch CUDA. So the pool keeps, per configuration, a `ZeroGpuEngine`: what needs no device (the plan, the
tokenizer, prompt encoding, the checkpoint in CPU memory) in the server, and the last figures a call sent back
(`EngineInfo`, `EngineStats`, step records), so the panel and the charts keep showing them between calls. Each
reply, measurement or check runs as one call. The worker builds the engine from the checkpoint the server read into
CPU memory once, when it opened the configuration (`hold_checkpoint`: the forked worker inherits it and only moves
it to its device); the engine's loop thread, KV pool, prefix cache, CUDA graphs and step history are new each time
(no prefix is cached across turns). It runs one job, closes the engine and sends back plain records. What needs
worker processes or a long-lived engine is refused with the reason (`refusal`). Each call asks for a duration
computed from the request: the steps it will run times this configuration's measured step time (an estimate before
the first call), plus its measured load time, with a margin; past `Settings.zero_gpu_max_seconds` it is refused
before it starts.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from engine import (
    Engine,
    EngineConfig,
    EngineInfo,
    EngineStats,
    PromptEncoder,
    RequestError,
    SamplingParams,
    StepRecord,
    encode_prompt,
    hold_checkpoint,
    load_tokenizer,
    plan_engine,
    release_checkpoint,
    self_check,
)
from playground.shared.errors import Refused

ONE_CALL = "ZeroGPU mode runs each reply in one forked call on one GPU slice"
REFUSED_VALUES = {  # field -> (the values ZeroGPU mode keeps, why the others cannot run)
    "tensor_parallel_size": ((1,), f"{ONE_CALL}: there are no worker processes or second GPU for tensor ranks"),
    "pipeline_parallel_size": ((1,), f"{ONE_CALL}: there are no worker processes or second GPU for stages"),
    "disaggregation": (("off",), f"{ONE_CALL}: its prefill and decode workers are processes that would outlive it"),
}
NOT_PER_CALL = (f"{ONE_CALL}, which rebuilds the engine each time: this needs an engine that stays loaded between "
                "requests (the chat, Compare and Benchmark work)")
# Before a configuration's first call has measured them: a decode step on a ZeroGPU slice (about 3x the ~11 ms of
# kernel launches a step costs this engine on a GPU without CUDA graphs, docs/gpu.md) and a load from the checkpoint.
ESTIMATED_STEP_S = 0.03
ESTIMATED_LOAD_S = 30.0
MARGIN = 1.5  # asked duration = MARGIN x the estimate + CALL_OVERHEAD_S (a call past its duration is stopped)
CALL_OVERHEAD_S = 2.0  # the fork, the queues and the worker's first imports, whatever the request
CHECK_STEPS = 32  # the start-up check: the engine's warm-up and its 16-token reply
PERPLEXITY_STEPS = 200  # the held-out text's scoring windows, a stated bound
STEP_HISTORY = 4096


def refusal(field_name: str, value) -> str | None:
    """Why `field_name=value` cannot run in ZeroGPU mode, or None."""
    kept = REFUSED_VALUES.get(field_name)
    return None if kept is None or value in kept[0] else kept[1]


def config_refusal(config: EngineConfig) -> str | None:
    """Why `config` cannot run in ZeroGPU mode (its first field that cannot), or None."""
    for field_name in REFUSED_VALUES:
        reason = refusal(field_name, getattr(config, field_name))
        if reason:
            return f"{field_name}={getattr(config, field_name)}: {reason}"
    return None


# ----- inside the call (the forked worker) -----------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """What a call sends back after its job: the engine it built, as plain records."""

    info: EngineInfo
    stats: EngineStats
    steps: list[StepRecord]


def in_call(job: Callable[[Engine, object], Iterator], config: EngineConfig, payload, seconds: float) -> Iterator:
    """The decorated function: build `config`'s engine, yield what `job(engine, payload)` yields, then a Snapshot,
    and close the engine. `seconds` is only the duration asked for (`asked`)."""
    engine = Engine(config)
    try:
        yield from job(engine, payload)
        yield Snapshot(engine.info, engine.stats(), engine.step_history())
    finally:
        engine.close()


def asked(job, config, payload, seconds: float) -> float:
    """The dynamic duration `spaces.GPU` calls with the call's own arguments: the one the server computed."""
    return seconds


def stream_job(engine: Engine, payload) -> Iterator:
    prompt, params = payload
    yield from engine.stream(prompt, params)


def generate_job(engine: Engine, payload) -> Iterator:
    prompts, params = payload
    yield engine.generate(prompts, params)


def check_job(engine: Engine, _payload) -> Iterator:
    yield self_check(engine)


def perplexity_job(engine: Engine, texts) -> Iterator:
    yield engine.perplexity(texts)


# ----- in the server ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallRecord:
    """One GPU call as the server saw it: the duration asked, the engine's rebuild (load) time, the call's wall time."""

    seconds_asked: float
    load_seconds: float
    wall_seconds: float

    def figures(self) -> dict:
        """As a reply's figures (the chip under it, and the `/chat` API's figures)."""
        return {"zerogpu_call_s": round(self.wall_seconds, 2), "zerogpu_asked_s": round(self.seconds_asked, 1),
                "zerogpu_rebuild_s": round(self.load_seconds, 2)}

    def line(self) -> str:
        return (f"ZeroGPU call: {self.wall_seconds:.1f} s of the {self.seconds_asked:.0f} s asked, of which "
                f"{self.load_seconds:.1f} s rebuilt the engine")


class ZeroGpu:
    """The GPU acquisition: `spaces.GPU(in_call)` with the duration each call asks (real on a ZeroGPU Space;
    off one, `spaces.GPU` returns the function itself and the call runs in this process)."""

    def __init__(self, max_seconds: int):
        try:
            import spaces  # preinstalled on a ZeroGPU Space; test-only here (requirements-test.txt)
        except ImportError as error:
            raise RuntimeError("ZeroGPU mode (SPACES_ZERO_GPU or PLAYGROUND_ZEROGPU) needs the spaces package, which "
                               "ZeroGPU Spaces preinstall: pip install spaces==0.51.3") from error

        self.max_seconds = max_seconds
        self.call = spaces.GPU(in_call, duration=asked)


class ZeroGpuEngine:
    """One configuration in ZeroGPU mode: the parts that need no device here, the rest one GPU call at a time.

    It answers what the pool's users read of an engine (`info`, `stats()`, `step_history()`, `tokenizer`, `encode`,
    `stream`, `generate`, `perplexity`) from the calls' snapshots; what needs an engine that stays loaded
    (`submit`, the decode profile) raises RequestError with the reason.
    """

    def __init__(self, config: EngineConfig, gpu: ZeroGpu):
        self.requested, self._gpu = config, gpu
        self.plan = plan_engine(config)  # downloads a hub model here, on the CPU, not inside a timed call
        self.config = self.plan.config
        self.tokenizer = load_tokenizer(self.plan.path)
        # The native model's checkpoint (and its draft's) in CPU memory: each call's worker inherits it and only
        # moves it to its device.
        self.held_paths = ([self.plan.path, *([self.plan.draft.path] if self.plan.draft else [])]
                           if self.plan.backend == "native" else [])
        self.held_bytes = sum(hold_checkpoint(path) for path in self.held_paths)
        self._prompts = PromptEncoder(self.tokenizer) if self.tokenizer is not None else None
        self._lock = threading.Lock()
        self._steps: deque[StepRecord] = deque(maxlen=STEP_HISTORY)
        self._stats = EngineStats()
        self.held_out_perplexity = None
        self.last_call: CallRecord | None = None  # the newest call of any thread
        self._thread_calls = threading.local()  # each thread's own newest call (`thread_call`)
        self.info: EngineInfo | None = None  # the last call's engine (the check below sets it)
        self.checked = self._one(check_job, None, CHECK_STEPS, "the start-up check")

    # ----- what needs no device -----------------------------------------------------------------------------------

    @property
    def renders_tools(self) -> bool:
        return self._prompts is not None and self._prompts.renders_tools

    def encode(self, prompt, tools: list[dict] | None = None) -> list[int]:
        return encode_prompt(self._prompts, prompt, tools, self.plan.vocab_size, self.config.max_model_len)

    def stats(self) -> EngineStats:
        return self._stats

    def step_history(self, since: float = 0.0) -> list[StepRecord]:
        with self._lock:
            return [step for step in self._steps if step.time > since]

    def close(self) -> None:
        """Lets go of the checkpoints held in memory (each call closed its own engine)."""
        for path in self.held_paths:
            release_checkpoint(path)
        self.held_paths = []

    # ----- durations ---------------------------------------------------------------------------------------------

    def seconds_for(self, steps: float, what: str, arrivals: float = 0.0) -> float:
        """The duration to ask for `steps` engine steps, the requests arriving over `arrivals` seconds (with this
        configuration's measured step and load times once a call has measured them); Refused past the server's
        maximum, before anything runs."""
        load = self.info.load_seconds if self.info is not None else ESTIMATED_LOAD_S
        step = self._step_seconds() or ESTIMATED_STEP_S
        seconds = MARGIN * (load + max(steps * step, arrivals)) + CALL_OVERHEAD_S
        if seconds > self._gpu.max_seconds:
            raise Refused(f"{what} would need about {seconds:.0f} s of GPU ({steps:,.0f} steps at "
                          f"{step * 1000:.0f} ms + {load:.1f} s to rebuild the engine, x{MARGIN}, + "
                          f"{CALL_OVERHEAD_S:.0f} s per call), over this server's ZeroGPU call limit of "
                          f"{self._gpu.max_seconds} s (PLAYGROUND_ZEROGPU_MAX_SECONDS): ask for fewer requests or "
                          "tokens")
        return seconds

    def _step_seconds(self) -> float | None:
        """Mean duration of the steps the last calls ran (None before any)."""
        with self._lock:
            steps = list(self._steps)[-256:]
        return sum(step.duration for step in steps) / len(steps) if steps else None

    # ----- the calls ---------------------------------------------------------------------------------------------

    def call(self, job, payload, seconds: float) -> Iterator:
        """Run `job(engine, payload)` in one GPU call of `seconds`, yielding what it yields; keeps its snapshot."""
        started, self._thread_calls.record = time.perf_counter(), None
        for item in self._gpu.call(job, self.requested, payload, seconds):
            if isinstance(item, Snapshot):
                with self._lock:
                    self.info, self._stats = item.info, item.stats
                    self._steps.extend(item.steps)
                    self.last_call = CallRecord(seconds, item.info.load_seconds, time.perf_counter() - started)
                self._thread_calls.record = self.last_call
            else:
                yield item

    def thread_call(self) -> CallRecord | None:
        """The newest call this thread made (its reply's own call, whatever other threads called meanwhile)."""
        return getattr(self._thread_calls, "record", None)

    def _one(self, job, payload, steps: float, what: str):
        """A call whose job yields one result."""
        (result,) = list(self.call(job, payload, self.seconds_for(steps, what)))
        return result

    def stream(self, prompt, params: SamplingParams | None = None) -> Iterator:
        params = params or SamplingParams()
        prompt_steps = len(prompt) / self.config.max_num_batched_tokens if isinstance(prompt, list) else 1
        return self.call(stream_job, (prompt, params),
                         self.seconds_for(1 + prompt_steps + params.max_tokens, "this reply"))

    def generate(self, prompts: list, params: SamplingParams | None = None) -> list:
        params = params or SamplingParams()
        waves = -(-len(prompts) // self.config.max_num_seqs)
        return self._one(generate_job, (prompts, params), waves * (1 + params.max_tokens), "these replies")

    def perplexity(self, texts: list[str] | None = None, progress=None):
        result = self._one(perplexity_job, texts, PERPLEXITY_STEPS, "the perplexity")
        if texts is None:
            self.held_out_perplexity = result
        return result

    def submit(self, prompt, params=None):
        raise RequestError(f"requests without a reply stream (the OpenAI routes) are off: {NOT_PER_CALL}")

    def check_guided(self, guided) -> None:
        raise RequestError(f"the OpenAI routes are off: {NOT_PER_CALL}")

    def decode_profile(self, since: float = 0.0):
        raise RequestError(f"the decode profile is off: {NOT_PER_CALL}")
