"""A decode profile: where the recent decode steps spent their time, against their matmul floor.

The steps' own timings come from `core/step_timing.py` (recorded on every native CPU step). The
floor is the same steps' matrix multiplies alone (every linear layer and the LM head, on as many
rows as each step had sequences, in the form the model computes them), timed in this process,
so the ratio compares like with like on the same machine under the same load.

On a GPU kernels run asynchronously, so wall-clock sections would be wrong: steps are not profiled there.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from engine.core.step_timing import SECTIONS, StepTiming
from engine.model.linear import LinearBase

FLOOR_REPEATS = 5
MAX_FLOOR_BATCH_SIZES = 12
SECTION_LABELS = {
    "schedule": "scheduling (who runs, the plan)",
    "prepare": "step tensors and attention metadata",
    "fused_layers": "decoder layers as one kernel call (<= 8 sequences: matmuls, attention, KV writes)",
    "attention": "attention (reads cached K/V)",
    "kv_write": "KV writes into the pool",
    "kv_gather": "KV gathers into padded copies",
    "lm_head": "LM head",
    "guided_mask": "grammar masks of guided requests (compute + apply)",
    "sample": "sampling",
    "deliver": "token delivery and bookkeeping",
    "layers": "decoder layers' matmuls, norms, RoPE, activations",
}


@dataclass(frozen=True)
class DecodeProfile:
    """The recent decode-only steps of one engine against their matmul floor (times in milliseconds).

    `step_ms` is the median decode step; `floor_ms` the median, over the same steps, of the matrix
    multiplies alone at each step's batch size (`lm_head_floor_ms` its LM-head part); `floor_ratio` the
    median of each step's time over its own floor. `shares` are fractions of the steps' total time; "layers"
    is what the timed sections leave (the decoder layers' matmuls, norms, rotary embedding and
    activations). The `cpu_` figures are the same in process CPU time and `thread_shares` the shares in
    the loop thread's CPU time: other processes on the machine do not inflate them, and with one torch
    thread they measure what the wall-clock ones would on an idle machine.
    """

    steps: int
    mean_batch_size: float
    mean_context_len: float
    step_ms: float
    floor_ms: float
    lm_head_floor_ms: float
    floor_ratio: float
    cpu_step_ms: float
    cpu_floor_ms: float
    cpu_floor_ratio: float
    minor_faults_per_step: float
    shares: dict[str, float] = field(default_factory=dict)
    thread_shares: dict[str, float] = field(default_factory=dict)

    def format(self) -> str:
        """A short multi-line report (what `python -m engine.bench --profile` prints)."""
        lines = [f"decode profile: {self.steps} decode steps, mean batch {self.mean_batch_size:.1f}, "
                 f"mean context {self.mean_context_len:.0f} tokens",
                 f"  step time          {self.step_ms:8.2f} ms   (CPU time {self.cpu_step_ms:.2f} ms)",
                 f"  matmul floor       {self.floor_ms:8.2f} ms   (CPU time {self.cpu_floor_ms:.2f} ms; the same "
                 f"steps' matrix multiplies alone, LM head {self.lm_head_floor_ms:.2f} ms)",
                 f"  step / floor       {self.floor_ratio:8.2f}x   (CPU time {self.cpu_floor_ratio:.2f}x; fraction of "
                 f"floor {1 / self.floor_ratio:.2f})",
                 f"  minor page faults  {self.minor_faults_per_step:8.1f} per decode step",
                 "  shares of the step (wall time, loop thread's CPU time):"]
        for name, share in sorted(self.shares.items(), key=lambda item: -item[1]):
            lines.append(f"    {100 * share:5.1f}%  {100 * self.thread_shares.get(name, 0.0):5.1f}%  "
                         f"{SECTION_LABELS.get(name, name)}")
        return "\n".join(lines)


@dataclass(frozen=True)
class FloorTiming:
    """Median wall and CPU seconds of one step's matmuls alone, and of its LM head alone."""

    seconds: float
    cpu_seconds: float
    lm_head_seconds: float


def _timed(run) -> tuple[float, float]:
    run()
    wall, cpu = [], []
    for _ in range(FLOOR_REPEATS):
        started, cpu_started = time.perf_counter(), time.process_time()
        run()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
    return statistics.median(wall), statistics.median(cpu)


@torch.inference_mode()
def measure_matmul_floor(model, batch_size: int) -> FloorTiming:
    """One step's matrix multiplies alone at `batch_size` rows: every linear layer in order, in the form the
    model computes it (its LinearMethod), then the LM head."""
    layers = [module for module in model.modules() if isinstance(module, LinearBase)]
    dtype, device = layers[0].build.dtype, layers[0].build.device
    inputs = [torch.randn(batch_size, layer.input_size, dtype=dtype, device=device) for layer in layers]
    hidden = torch.randn(batch_size, model.spec.hidden_size, dtype=dtype, device=device)

    def lm_head() -> None:
        model.compute_logits(hidden)

    def all_matmuls() -> None:
        for layer, x in zip(layers, inputs, strict=True):
            layer.method.apply(layer, x, layer.bias)
        lm_head()

    seconds, cpu_seconds = _timed(all_matmuls)
    return FloorTiming(seconds, cpu_seconds, _timed(lm_head)[0])


def _floor_batch_sizes(batch_sizes: list[int]) -> list[int]:
    """The batch sizes to measure: all distinct ones, or evenly spread quantiles when there are many."""
    distinct = sorted(set(batch_sizes))
    if len(distinct) <= MAX_FLOOR_BATCH_SIZES:
        return distinct
    ordered = sorted(batch_sizes)
    picks = {ordered[round(i * (len(ordered) - 1) / (MAX_FLOOR_BATCH_SIZES - 1))] for i in range(MAX_FLOOR_BATCH_SIZES)}
    return sorted(picks | {distinct[0], distinct[-1]})


def _interpolate(points: dict[int, float], x: int) -> float:
    """Piecewise-linear in the batch size between measured sizes (clamped at the ends)."""
    sizes = sorted(points)
    if x <= sizes[0]:
        return points[sizes[0]]
    for low, high in zip(sizes, sizes[1:], strict=False):
        if x <= high:
            return points[low] + (points[high] - points[low]) * (x - low) / (high - low)
    return points[sizes[-1]]


def summarize_decode(steps: list[StepTiming], model) -> DecodeProfile | None:
    """The decode profile of `steps` with their matmul floor measured now (None without decode steps).

    Times are medians (of the steps, of each step's floor at its batch size, of the per-step ratios), so
    that a few steps slowed by another process on the machine do not decide the figures.
    """
    if not steps:
        return None
    measured = {size: measure_matmul_floor(model, size) for size in _floor_batch_sizes([s.batch_size for s in steps])}

    def floors(attribute: str) -> list[float]:
        points = {size: getattr(timing, attribute) for size, timing in measured.items()}
        return [_interpolate(points, step.batch_size) for step in steps]

    floor, cpu_floor = floors("seconds"), floors("cpu_seconds")
    count = len(steps)
    median = statistics.median
    return DecodeProfile(
        steps=count, mean_batch_size=sum(step.batch_size for step in steps) / count,
        mean_context_len=sum(step.context_tokens for step in steps) / sum(step.batch_size for step in steps),
        step_ms=1e3 * median(step.seconds for step in steps), floor_ms=1e3 * median(floor),
        lm_head_floor_ms=1e3 * median(floors("lm_head_seconds")),
        floor_ratio=median(step.seconds / f for step, f in zip(steps, floor, strict=True)),
        cpu_step_ms=1e3 * median(step.cpu_seconds for step in steps), cpu_floor_ms=1e3 * median(cpu_floor),
        cpu_floor_ratio=median(step.cpu_seconds / f for step, f in zip(steps, cpu_floor, strict=True)),
        minor_faults_per_step=sum(step.minor_faults for step in steps) / count,
        shares=_shares(steps, "sections", "seconds"), thread_shares=_shares(steps, "thread_sections", "thread_seconds"))


def _shares(steps: list[StepTiming], sections: str, total: str) -> dict[str, float]:
    """Each section's fraction of the steps' total; "layers" is the rest (the decoder layers outside sections)."""
    whole = sum(getattr(step, total) for step in steps) or 1.0
    shares = {name: sum(getattr(step, sections).get(name, 0.0) for step in steps) / whole for name in SECTIONS}
    shares = {name: share for name, share in shares.items() if share > 0}
    shares["layers"] = max(0.0, 1.0 - sum(shares.values()))
    return shares
