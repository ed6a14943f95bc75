"""What-if hardware: a measured configuration's prefill and decode steps projected onto other devices.

Why: a person measuring on a CPU laptop cannot see what the same configuration would do on a GPU, and a pure
roofline projection would be far off (the first GPU run spent about 11 ms a step launching eager operators, some
20x the roofline time of its 1.7B model). Each measured phase's work per step (FLOPs, bytes of weights, K/V and
the rest, from `roofline.PhasePoint`) is priced on a device as

    step time = max(FLOPs / peak FLOP/s at the configuration's precision, bytes / bandwidth) + overhead

where the overhead is a per-step term (kernel launches and host work): on a GPU, `Overhead` fitted to the
committed GPU runs (`gpu_calibration.py`); on the device the steps were measured on, what the measured step
took beyond its roofline time. The largest of the three terms is what bounds the step, and the toggle that
would move it most follows from that term (`toggle_for`). TTFT is one mean prefill step, TPOT one decode step
at each measured batch size, tokens/s the batch over TPOT. Every figure is an estimate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.info import EngineInfo
from engine.tools.device_table import DeviceSpec
from engine.tools.roofline import PhasePoint, RooflineReport

INTEGER_LEVELS = ("native-int8", "native-int4")  # levels whose matmuls multiply int8 activations and weights
MAX_BATCH_SIZES = 4  # decode batch sizes projected: those with the most steps


def precision_of(dtype: str, quantization: str) -> str:
    """The peak a configuration's matmuls run at: "int8" for the integer levels, else its dtype's ("fp32" or
    "bf16"; the other levels dequantize to the dtype)."""
    if quantization in INTEGER_LEVELS:
        return "int8"
    return "fp32" if dtype == "float32" else "bf16"


@dataclass(frozen=True)
class Overhead:
    """Seconds a step costs beyond its roofline time: `base` + `per_sequence` x the sequences in the step."""

    base: float
    per_sequence: float

    def seconds(self, batch: float) -> float:
        return self.base + self.per_sequence * batch


@dataclass(frozen=True)
class MeanStep:
    """One phase's mean step: its batch, tokens, FLOPs, bytes (weights, K/V, the rest) and measured time."""

    phase: str
    batch: float
    tokens: float
    flops: float
    weight_bytes: float
    kv_bytes: float
    other_bytes: float
    measured_seconds: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.other_bytes

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @classmethod
    def of(cls, point: PhasePoint) -> MeanStep:
        steps = point.steps or 1
        return cls(point.phase, point.mean_batch_size, point.tokens / steps, point.flops / steps,
                   point.weight_bytes / steps, point.kv_bytes / steps,
                   (point.bytes - point.weight_bytes - point.kv_bytes) / steps, point.seconds / steps)


@dataclass(frozen=True)
class Setting:
    """What the toggles' advice depends on: the configuration's precision, whether its weights are quantized,
    whether it has CUDA graphs, and whether the device is a GPU."""

    precision: str
    quantized: bool
    cuda_graphs: bool
    gpu: bool


def roofline_seconds(work: MeanStep, peak_flops: float, bandwidth: float) -> tuple[float, float]:
    """(compute, memory) seconds of one step: its FLOPs at the peak, its bytes at the bandwidth."""
    return work.flops / peak_flops, work.bytes / bandwidth


@dataclass(frozen=True)
class StepEstimate:
    """One phase on one device: the three terms of its step time, what bounds it, and the toggle to try."""

    phase: str
    batch: float
    tokens: float
    compute_seconds: float
    memory_seconds: float
    overhead_seconds: float
    toggle: str

    @property
    def seconds(self) -> float:
        """The estimated step time: the higher roof, plus the overhead."""
        return max(self.compute_seconds, self.memory_seconds) + self.overhead_seconds

    @property
    def bound(self) -> str:
        """"compute", "memory" or "overhead": the largest of the three terms."""
        terms = {"compute": self.compute_seconds, "memory": self.memory_seconds, "overhead": self.overhead_seconds}
        return max(terms, key=terms.get)

    @property
    def tokens_per_second(self) -> float:
        """Prefill: prompt tokens per second; decode: one token per sequence per step."""
        return (self.tokens if self.phase == "prefill" else self.batch) / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "seconds": self.seconds, "bound": self.bound,
                "tokens_per_second": self.tokens_per_second}


def toggle_for(work: MeanStep, bound: str, setting: Setting, device: DeviceSpec) -> str:
    """The toggle that would move this step most, from the term that bounds it (and, within memory, from whose
    bytes dominate; within compute, from the precision the device offers)."""
    decode = not work.is_prefill
    if bound == "overhead":
        if decode and setting.gpu and not setting.cuda_graphs:
            return "CUDA graphs (attention=flash-attn): one replay instead of launching each operator"
        if decode:
            return "a bigger batch (more requests at once, max_num_seqs): the fixed cost per step is shared"
        return "more prompts per step (max_num_batched_tokens): the fixed cost per step is shared"
    if bound == "memory":
        if work.kv_bytes > work.weight_bytes:
            return (f"kv_cache_dtype=int8 or fewer KV heads (gqa): K/V are {work.kv_bytes / work.bytes:.0%} of the "
                    "bytes read")
        share = f"weights are {work.weight_bytes / work.bytes:.0%} of the bytes read"
        if setting.precision == "fp32" and setting.gpu:
            return f"dtype=bfloat16: half the weight bytes ({share})"
        if setting.precision == "fp32" and not setting.quantized:
            return f"quantization=native-int8: a quarter of the weight bytes, in the engine's CPU kernels ({share})"
        if not setting.quantized:
            return f"quantization (8- or 4-bit weights): 1/2 to 1/4 of the weight bytes ({share})"
        return f"a bigger batch: the weights are read once for more tokens ({share})"
    faster = device.peak_flops.get("bf16", 0.0) / device.peak_flops.get("fp32", float("inf"))
    if setting.precision == "fp32" and faster > 1:
        return f"dtype=bfloat16: {faster:.0f}x the float32 peak on this device"
    if not decode:
        return "prefix caching: prompt prefixes seen before are not computed again"
    return "sparse-2:4 on a GPU, or a smaller model: fewer FLOPs per token"


def estimate(work: MeanStep, device: DeviceSpec, setting: Setting, overhead_seconds: float) -> StepEstimate:
    """`work` priced on `device` at the setting's precision, with this overhead."""
    compute, memory = roofline_seconds(work, device.peak_flops[setting.precision], device.bandwidth)
    terms = {"compute": compute, "memory": memory, "overhead": overhead_seconds}
    return StepEstimate(work.phase, work.batch, work.tokens, compute, memory, overhead_seconds,
                        toggle_for(work, max(terms, key=terms.get), setting, device))


@dataclass(frozen=True)
class MeasuredCheck:
    """A projection beside a measurement on the same device: a committed GPU run's decode TPOT."""

    device: str
    run: str
    batch: int
    measured_seconds: float
    projected_seconds: float

    @property
    def error(self) -> float:
        """Projected over measured, minus one."""
        return self.projected_seconds / self.measured_seconds - 1.0

    def to_dict(self) -> dict:
        return {**asdict(self), "error": self.error}


@dataclass(frozen=True)
class DeviceProjection:
    """The measured phases projected onto one device."""

    device: DeviceSpec
    measured_here: bool
    overhead: str        # where its figures and its overhead term come from, in words
    prefill: StepEstimate | None
    decode: list[StepEstimate]
    checks: list[MeasuredCheck] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"device": self.device.name, "source": self.device.source, "measured_here": self.measured_here,
                "peak_flops": self.device.peak_flops, "bandwidth": self.device.bandwidth,
                "memory_bytes": self.device.memory_bytes, "overhead": self.overhead,
                "prefill": self.prefill.to_dict() if self.prefill else None,
                "decode": [step.to_dict() for step in self.decode],
                "checks": [check.to_dict() for check in self.checks]}


@dataclass(frozen=True)
class HardwareProjection:
    """The measured configuration on every device: an estimate, with the notes that qualify it."""

    precision: str
    devices: list[DeviceProjection]
    notes: list[str]

    def to_dict(self) -> dict:
        return {"estimate": True, "precision": self.precision, "devices": [d.to_dict() for d in self.devices],
                "notes": self.notes}


def measured_phases(report: RooflineReport) -> tuple[MeanStep | None, list[MeanStep]]:
    """The prefill phase and the decode batch sizes with the most steps (up to MAX_BATCH_SIZES, by size)."""
    busiest = sorted(report.decode_by_batch, key=lambda point: point.steps, reverse=True)[:MAX_BATCH_SIZES]
    decode = [MeanStep.of(point) for point in sorted(busiest, key=lambda point: point.mean_batch_size)]
    return (MeanStep.of(report.prefill) if report.prefill else None), decode


def _measured_device(report: RooflineReport, precision: str) -> DeviceSpec:
    c = report.ceilings
    return DeviceSpec(f"{c.device} (measured here)", {precision: c.peak_flops}, c.bandwidth, 0.0,
                      f"the roofline's measured ceilings: matmul peak in {c.dtype}, memory read bandwidth")


def project(report: RooflineReport, info: EngineInfo, devices: tuple[DeviceSpec, ...], overhead: Overhead,
            checks: list[MeasuredCheck] | None = None) -> HardwareProjection:
    """The report's phases on the device they ran on (its measured ceilings; the overhead is what each measured
    step took beyond its roofline time) and on `devices` (their published figures and the calibrated GPU
    `overhead`); `checks` are set beside the device they were measured on."""
    precision = precision_of(info.dtype, info.quantization)
    quantized = info.quantization != "none"
    prefill, decode = measured_phases(report)

    def on(device: DeviceSpec, setting: Setting, overhead_of, words: str, measured_here: bool) -> DeviceProjection:
        def step(work: MeanStep) -> StepEstimate:
            return estimate(work, device, setting, overhead_of(work, device))
        return DeviceProjection(device, measured_here, words, step(prefill) if prefill else None,
                                [step(work) for work in decode],
                                [c for c in checks or [] if not measured_here and c.device == device.name])

    def residual(work: MeanStep, device: DeviceSpec) -> float:
        return max(work.measured_seconds - max(roofline_seconds(work, device.peak_flops[precision],
                                                                device.bandwidth)), 0.0)

    here = on(_measured_device(report, precision), Setting(precision, quantized, info.cuda_graphs,
                                                             info.device == "cuda"), residual,
              "measured ceilings; overhead: what each measured step took beyond its roofline time", True)
    gpu = Setting(precision, quantized, cuda_graphs=False, gpu=True)
    projections = [here] + [on(device, gpu, lambda work, _: overhead.seconds(work.batch),
                               "published figures; overhead: the GPU fit", False) for device in devices]
    notes = [f"estimates: every step priced at the {precision} peak and the bandwidth, plus a per-step overhead; "
             "not measurements",
             f"GPU overhead (the GPU fit): {1e3 * overhead.base:.1f} ms + {1e3 * overhead.per_sequence:.2f} ms per "
             "sequence a step, fitted to the committed GPU runs (eager PyTorch, no CUDA graphs)"]
    if info.quantization in INTEGER_LEVELS:
        notes.append(f"{info.quantization} runs only on a CPU here; the GPUs are priced as if int8 kernels ran it")
    return HardwareProjection(precision, projections, notes)
