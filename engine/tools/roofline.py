"""A measured roofline: where the engine's prefill and decode steps sit against the device's ceilings.

"Profile first": a decode step that reads every weight to produce one token per sequence is limited by
memory bandwidth, a long prefill by arithmetic. This module makes that visible with numbers measured on
the machine the engine runs on:

- the device's ceilings (`DeviceCeilings`): the best matrix-multiply FLOP/s in the engine's dtype and the
  best memory read bandwidth, measured in a few seconds and cached per device, dtype and thread count in
  a JSON file outside the repository (`ceilings_cache_path`), so they are measured once;
- the work of each recorded step (`StepWork`), counted from the model's shapes and the step's batch
  (`StepRecord`: tokens, scored rows, K/V positions attended, causal (query, key) pairs): FLOPs of the
  linear layers, the LM head and attention; bytes of the weights read once per step (their real storage,
  so quantized weights count packed), the K/V read and written, the embedding rows and the logits. These
  are the minimum bytes a step must move (activations that stay in cache are not counted), so a step's
  arithmetic intensity here is an upper bound, as in the usual LLM rooflines;
- each phase's steps summed (`PhasePoint`): FLOPs and bytes over their time give the achieved FLOP/s and
  bytes/s; intensity = FLOPs / bytes; the attainable FLOP/s at that intensity is min(peak, intensity x
  bandwidth); the phase is memory-bound left of the ridge (peak / bandwidth), compute-bound right of it,
  and its fraction of the ceiling is achieved / attainable. Under `OVERHEAD_BELOW` of its ceiling a phase is
  called neither bound: overhead. The roof it sits under is not what holds it back then; the step's time goes to
  what neither roof counts (scheduling, sampling, Python, thread hand-offs, small kernels' fixed costs). A third
  is where the demo's steps part: at 8-27% of their roof they speed up with less overhead, not with more bandwidth.

A step's time is the engine's whole step (scheduling, sampling and Python overhead included, the draft
model's proposing excluded), so the fractions say how close the engine as a whole comes to the hardware.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from engine.core.metrics import describe_device
from engine.info import EngineInfo, StepRecord
from engine.model.matmul import MatmulPlan, linear, onednn_available
from engine.model.spec import ModelSpec
from engine.plan import DTYPES

CACHE_ENV = "INFERENCE_PLAYGROUND_CEILINGS"
# Best of many short runs: on a shared machine some of them get the cores to themselves.
MATMUL_REPEATS = 12
READ_REPEATS = 20
CPU_MATMUL_SIZE = 1536
GPU_MATMUL_SIZE = 8192
CPU_BANDWIDTH_BYTES = 256 * 2**20   # far larger than a CPU's last-level cache
GPU_BANDWIDTH_BYTES = 2 * 2**30
LOGIT_BYTES = 4  # logits come back in float32


# ---- the device's ceilings -----------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceCeilings:
    """The best matmul FLOP/s (in `dtype`) and memory read bandwidth measured on one device.

    `source` is "measured" when this call measured them, "cache" when they were read from the cache file.
    """

    device: str
    dtype: str
    threads: int
    peak_flops: float
    bandwidth: float  # bytes per second
    matmul_size: int
    bandwidth_bytes: int
    measured_at: str
    seconds: float
    source: str = "measured"
    runs: int = 1  # measurements behind these figures (each ceiling is the best of them)

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte where the bandwidth slope meets the compute roof."""
        return self.peak_flops / self.bandwidth

    def attainable_flops(self, intensity: float) -> float:
        return min(self.peak_flops, intensity * self.bandwidth)

    def describe(self) -> str:
        """One line: the device, both ceilings, the ridge, and where the numbers come from."""
        return (f"{self.device}, {self.dtype}, {self.threads} thread(s): matmul peak {self.peak_flops / 1e9:.1f} "
                f"GFLOP/s ({self.matmul_size}x{self.matmul_size}), memory read {self.bandwidth / 1e9:.1f} GB/s "
                f"({self.bandwidth_bytes / 2**20:.0f} MiB), ridge {self.ridge_intensity:.2f} FLOP/byte; "
                f"{'from the cache' if self.source == 'cache' else 'measured now'}, the best of {self.runs} "
                f"measurement(s), the last at {self.measured_at} ({self.seconds:.1f} s)")


def ceilings_cache_path() -> Path:
    """The cache file: $INFERENCE_PLAYGROUND_CEILINGS, else under $XDG_CACHE_HOME (or ~/.cache)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "inference-playground" / "device-ceilings.json"


def ceilings_key(device: str, dtype: str) -> str:
    """One cache entry per device, dtype and (on a CPU) thread count, which sets how many cores compute."""
    if device == "cuda":
        return f"{describe_device()} | {dtype}"
    return f"{describe_device()} | {dtype} | {torch.get_num_threads()} threads"


def _best_seconds(run: Callable[[], None], synchronize: Callable[[], None], repeats: int) -> float:
    run()
    synchronize()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        synchronize()
        times.append(time.perf_counter() - started)
    return min(times)


def _matmul_seconds(size: int, dtype: torch.dtype, device: str, synchronize: Callable[[], None]) -> float:
    """Best time of a [size, size] x [size, size] product in every form the engine multiplies with here
    (`engine/model/matmul.py`: MKL, and oneDNN for float32 on a CPU)."""
    x = torch.randn(size, size, device=device).to(dtype)
    weight = torch.randn(size, size, device=device).to(dtype)
    both = device == "cpu" and dtype == torch.float32 and onednn_available()
    forms = ["mkl", "onednn"] if both else ["mkl"]
    return min(_best_seconds(lambda form=form: linear(MatmulPlan(False, form), x, weight, None), synchronize,
                             MATMUL_REPEATS) for form in forms)


def _read_seconds(num_bytes: int, device: str, synchronize: Callable[[], None]) -> float:
    buffer = torch.ones(num_bytes // 4, device=device, dtype=torch.float32)
    return _best_seconds(buffer.sum, synchronize, READ_REPEATS)


@torch.inference_mode()
def measure_ceilings(device: str, dtype: str) -> DeviceCeilings:
    """Measure now: a square matmul in `dtype` (best of a few) and a full read of a float32 buffer far larger
    than any cache (a sum; best of a few), synchronising a GPU around each run."""
    started = time.perf_counter()
    on_gpu = device == "cuda"
    synchronize = torch.cuda.synchronize if on_gpu else (lambda: None)
    size = GPU_MATMUL_SIZE if on_gpu else CPU_MATMUL_SIZE
    matmul_seconds = _matmul_seconds(size, DTYPES[dtype], device, synchronize)
    buffer_bytes = GPU_BANDWIDTH_BYTES if on_gpu else CPU_BANDWIDTH_BYTES
    read_seconds = _read_seconds(buffer_bytes, device, synchronize)
    return DeviceCeilings(
        device=describe_device(), dtype=dtype, threads=1 if on_gpu else torch.get_num_threads(),
        peak_flops=2.0 * size**3 / matmul_seconds, bandwidth=buffer_bytes / read_seconds, matmul_size=size,
        bandwidth_bytes=buffer_bytes, measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        seconds=time.perf_counter() - started)


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _cached(cache: dict, key: str) -> DeviceCeilings | None:
    try:
        return DeviceCeilings(**{**cache[key], "source": "cache"}) if isinstance(cache.get(key), dict) else None
    except TypeError:  # written by another version: measure again
        return None


def device_ceilings(device: str, dtype: str, refresh: bool = False, cache_path: Path | None = None,
                    measure: Callable[[str, str], DeviceCeilings] = measure_ceilings) -> DeviceCeilings:
    """The ceilings of `device` in `dtype`: from the cache file when there, else measured now and written to it.

    `refresh` measures again and keeps, for each ceiling, the best of this and the earlier measurements: a
    ceiling is the most the device was seen to do, and on a shared machine a measurement can only fall short
    of it (other processes take cores and bandwidth), never exceed it."""
    path = cache_path or ceilings_cache_path()
    key = ceilings_key(device, dtype)
    cache = _read_cache(path)
    earlier = _cached(cache, key)
    if earlier is not None and not refresh:
        return earlier
    ceilings = measure(device, dtype)
    if earlier is not None:
        ceilings = replace(ceilings, peak_flops=max(ceilings.peak_flops, earlier.peak_flops),
                           bandwidth=max(ceilings.bandwidth, earlier.bandwidth), runs=earlier.runs + 1)
    cache[key] = {k: v for k, v in asdict(ceilings).items() if k != "source"}
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(cache, indent=2), encoding="utf-8")
    temporary.replace(path)
    return ceilings


# ---- the work of a step ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelWork:
    """Per-step work coefficients of one loaded configuration, from its shapes and its weights' real bytes."""

    linear_flops_per_token: float     # 2 x the decoder layers' linear weights (Q, K, V, O, gate, up, down)
    lm_head_flops_per_row: float      # 2 x hidden x vocab, for each row that gets logits
    attention_flops_per_pair: float   # QK^T and PV: 4 x heads x head_dim, per (query, key) pair, all layers
    weight_bytes_per_step: int        # every weight the step reads once (the embedding table excepted when untied)
    embedding_bytes_per_token: int    # one embedding row gathered per token
    kv_bytes_per_token: int           # K and V of one token, all layers
    logits_bytes_per_row: int

    @classmethod
    def of(cls, spec: ModelSpec, weights_bytes: int, kv_bytes_per_token: int, dtype: str) -> ModelWork:
        element = DTYPES[dtype].itemsize
        q_out, kv_out = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        per_layer = (spec.hidden_size * (q_out + 2 * kv_out) + q_out * spec.hidden_size
                     + 3 * spec.hidden_size * spec.intermediate_size)
        embedding = spec.vocab_size * spec.hidden_size * element
        return cls(
            linear_flops_per_token=2.0 * per_layer * spec.num_layers,
            lm_head_flops_per_row=2.0 * spec.hidden_size * spec.vocab_size,
            attention_flops_per_pair=4.0 * spec.num_heads * spec.head_dim * spec.num_layers,
            weight_bytes_per_step=weights_bytes - (0 if spec.tie_word_embeddings else embedding),
            embedding_bytes_per_token=spec.hidden_size * element,
            kv_bytes_per_token=kv_bytes_per_token, logits_bytes_per_row=spec.vocab_size * LOGIT_BYTES)


@dataclass(frozen=True)
class StepWork:
    """FLOPs and minimum bytes of one step, split by where they come from."""

    linear_flops: float
    attention_flops: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    other_bytes: float  # embedding rows and logits

    @property
    def flops(self) -> float:
        return self.linear_flops + self.attention_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.other_bytes

    @classmethod
    def of(cls, step: StepRecord, work: ModelWork) -> StepWork:
        rows = step.num_decode_tokens  # every row that gets logits produces (or verifies) a token
        return cls(
            linear_flops=step.num_tokens * work.linear_flops_per_token + rows * work.lm_head_flops_per_row,
            attention_flops=step.attention_pairs * work.attention_flops_per_pair,
            weight_bytes=work.weight_bytes_per_step,
            kv_read_bytes=step.context_tokens * work.kv_bytes_per_token,
            kv_write_bytes=step.num_tokens * work.kv_bytes_per_token,
            other_bytes=step.num_tokens * work.embedding_bytes_per_token + rows * work.logits_bytes_per_row)


def is_decode(step: StepRecord) -> bool:
    """A step that only extends running sequences (one token each, plus verified proposals): no prompt tokens."""
    return step.num_tokens == step.num_decode_tokens


# ---- phases on the roofline --------------------------------------------------------------------------

OVERHEAD_BELOW = 1 / 3  # a phase under this fraction of its ceiling is overhead-bound (module docstring)


@dataclass(frozen=True)
class PhasePoint:
    """A set of steps summed: their work, time, place on the roofline and fraction of the ceiling there."""

    phase: str
    steps: int
    tokens: int
    mean_batch_size: float
    seconds: float
    flops: float
    bytes: float
    weight_bytes: float
    kv_bytes: float
    intensity: float            # FLOPs per byte
    achieved_flops: float       # FLOPs / second
    achieved_bandwidth: float   # bytes / second
    attainable_flops: float     # the roof at this intensity
    bound: str                  # "memory" | "compute"
    fraction_of_ceiling: float  # achieved / attainable

    @classmethod
    def of(cls, phase: str, steps: list[StepRecord], work: ModelWork, ceilings: DeviceCeilings) -> PhasePoint:
        works = [StepWork.of(step, work) for step in steps]
        seconds = sum(max(step.duration - step.propose_duration, 0.0) for step in steps)
        flops, moved = sum(w.flops for w in works), sum(w.bytes for w in works)
        intensity = flops / moved if moved else 0.0
        achieved = flops / seconds if seconds else 0.0
        attainable = ceilings.attainable_flops(intensity)
        return cls(
            phase=phase, steps=len(steps), tokens=sum(step.num_tokens for step in steps),
            mean_batch_size=sum(step.batch_size for step in steps) / len(steps), seconds=seconds, flops=flops,
            bytes=moved, weight_bytes=sum(w.weight_bytes for w in works),
            kv_bytes=sum(w.kv_read_bytes + w.kv_write_bytes for w in works), intensity=intensity,
            achieved_flops=achieved, achieved_bandwidth=moved / seconds if seconds else 0.0,
            attainable_flops=attainable, bound="memory" if intensity < ceilings.ridge_intensity else "compute",
            fraction_of_ceiling=achieved / attainable if attainable else 0.0)

    @property
    def overhead_bound(self) -> bool:
        """Far below both roofs: under OVERHEAD_BELOW of its ceiling."""
        return self.fraction_of_ceiling < OVERHEAD_BELOW

    @property
    def verdict(self) -> str:
        """What holds the phase back: "memory-bound", "compute-bound", or "neither bound: overhead" far below both."""
        return "neither bound: overhead" if self.overhead_bound else f"{self.bound}-bound"

    def sentence(self, ceilings: DeviceCeilings) -> str:
        """The phase in words: where it sits, what holds it back, how close it comes."""
        if self.bound == "memory":
            position = (f"{self.intensity:.1f} FLOP/byte, left of the ridge at {ceilings.ridge_intensity:.1f}; it "
                        f"moves {self.achieved_bandwidth / 1e9:.1f} GB/s of the {ceilings.bandwidth / 1e9:.1f} GB/s "
                        "measured")
        else:
            position = (f"{self.intensity:.1f} FLOP/byte, right of the ridge at {ceilings.ridge_intensity:.1f}; it "
                        f"computes {self.achieved_flops / 1e9:.1f} GFLOP/s of the {ceilings.peak_flops / 1e9:.1f} "
                        "GFLOP/s measured")
        text = f"{self.phase} ({self.steps} steps, mean batch {self.mean_batch_size:.1f}) is "
        if self.overhead_bound:
            text += (f"{self.verdict}. It reaches {self.fraction_of_ceiling:.0%} of its ceiling (under "
                     f"{OVERHEAD_BELOW:.0%}), so its time goes to what neither roof counts: scheduling, sampling, "
                     f"Python, small kernels' fixed costs. It sits under the {self.bound} roof at {position}")
        else:
            text += f"{self.verdict}: {position}: {self.fraction_of_ceiling:.0%} of its ceiling"
        if self.fraction_of_ceiling > 1 and self.bound == "memory":
            text += (" (above the measured memory bandwidth: part of the "
                     f"{self.bytes / self.steps / 1e6:.1f} MB it reads each step stays in the CPU's caches between "
                     "steps)")
        elif self.fraction_of_ceiling > 1:
            text += (" (above the measured matmul peak: the ceilings were measured under a different load, or this "
                     "phase's matmul shapes run faster than the square product measured; measure them again)")
        return text + "."


@dataclass(frozen=True)
class RooflineReport:
    """The measured steps of one configuration against the device's ceilings."""

    ceilings: DeviceCeilings
    prefill: PhasePoint | None
    decode: PhasePoint | None
    decode_by_batch: list[PhasePoint] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> list[str]:
        """One sentence per phase (and the notes), as the playground and `engine.bench` print them."""
        lines = [phase.sentence(self.ceilings) for phase in (self.prefill, self.decode) if phase]
        if not lines:
            lines.append("no prefill or decode steps recorded in this window yet")
        return lines + self.notes

    def format(self) -> str:
        """The bench's roofline section."""
        return "\n".join([f"roofline: {self.ceilings.describe()}"] + [f"  {line}" for line in self.summary()])

    def to_dict(self) -> dict:
        """Plain data for the bench's JSON report."""
        def point(phase: PhasePoint | None) -> dict | None:
            return asdict(phase) if phase else None
        return {"ceilings": {**asdict(self.ceilings), "ridge_intensity": self.ceilings.ridge_intensity},
                "prefill": point(self.prefill), "decode": point(self.decode),
                "decode_by_batch": [asdict(p) for p in self.decode_by_batch], "summary": self.summary()}


def analyze(steps: list[StepRecord], work: ModelWork, ceilings: DeviceCeilings,
            notes: list[str] | None = None) -> RooflineReport:
    """Place `steps` on the roofline: prefill (steps with prompt tokens), decode, and decode per batch size.

    Steps without attention coverage (backends that do not record it) are left out."""
    recorded = [step for step in steps if step.context_tokens and step.duration > 0]
    decode = [step for step in recorded if is_decode(step)]
    prefill = [step for step in recorded if not is_decode(step)]
    by_batch: dict[int, list[StepRecord]] = {}
    for step in decode:
        by_batch.setdefault(step.batch_size, []).append(step)
    return RooflineReport(
        ceilings=ceilings,
        prefill=PhasePoint.of("prefill", prefill, work, ceilings) if prefill else None,
        decode=PhasePoint.of("decode", decode, work, ceilings) if decode else None,
        decode_by_batch=[PhasePoint.of(f"decode, batch {size}", group, work, ceilings)
                         for size, group in sorted(by_batch.items())],
        notes=list(notes or []))


def model_work(engine) -> ModelWork:
    """The work coefficients of a loaded native engine: its plan's shapes (after GQA conversion) and its weights."""
    stats = engine.stats()
    target_bytes = stats.weights_bytes - stats.draft_weights_bytes
    return ModelWork.of(engine.plan.spec, target_bytes, engine.info.kv_bytes_per_token, engine.info.dtype)


def unsupported_reason(info: EngineInfo) -> str | None:
    """Why an engine's steps cannot be placed on the roofline, or None."""
    if info.backend == "llama.cpp":
        return "the roofline models the native engine's steps (its weights' formats and kernels); use backend=native"
    if info.backend != "native":
        return "the transformers backend does not record what its steps' attention covers; use backend=native"
    return None


def engine_roofline(engine, since: float = 0.0, refresh: bool = False,
                    cache_path: Path | None = None) -> RooflineReport:
    """The roofline of the steps `engine` finished after `since` (a `time.perf_counter()` value).

    Raises ValueError (with the reason) for an engine whose steps cannot be placed."""
    info = engine.info
    reason = unsupported_reason(info)
    if reason:
        raise ValueError(reason)
    ceilings = device_ceilings(info.device, info.dtype, refresh=refresh, cache_path=cache_path)
    notes = []
    if info.quantization != "none":
        notes.append(f"weights are {info.quantization}: bytes are their packed storage; the compute ceiling "
                     f"is {info.dtype} matmuls (the libraries dequantize to it)")
    size = info.tensor_parallel_size
    if size > 1:
        if info.device == "cuda":
            ceilings = DeviceCeilings(**{**asdict(ceilings), "peak_flops": ceilings.peak_flops * size,
                                         "bandwidth": ceilings.bandwidth * size})
            notes.append(f"tensor parallel over {size} GPUs: the ceilings are {size}x one GPU's")
        else:
            notes.append(f"tensor parallel over {size} processes sharing this CPU's cores: the ceilings are the "
                         "whole CPU's (measured with this process's threads)")
    return analyze(engine.step_history(since), model_work(engine), ceilings, notes)




def roofline_figures(engine, since: float) -> dict:
    """A measured run's steps on the roofline as report keys (`python -m engine.bench`): `roofline` (the full
    report), `roofline_text`, the ceilings, and each phase's intensity, bound and fraction of its ceiling; or
    the reason they cannot be placed."""
    try:
        report = engine_roofline(engine, since)
    except ValueError as error:
        return {"roofline": None, "roofline_text": f"roofline: not available ({error})"}
    figures = {"roofline": report.to_dict(), "roofline_text": report.format(),
               "device_peak_flops": report.ceilings.peak_flops, "device_bandwidth": report.ceilings.bandwidth}
    for phase in (report.prefill, report.decode):
        if phase:
            figures.update({f"roofline_{phase.phase}_intensity": phase.intensity,
                            f"roofline_{phase.phase}_bound": phase.bound,
                            f"roofline_{phase.phase}_fraction": phase.fraction_of_ceiling})
    return figures
