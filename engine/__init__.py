"""A compact LLM serving engine: paged KV cache, continuous batching, prefix caching, streaming.

Public API (see DESIGN.md): `Engine`, `EngineConfig`, `SamplingParams`, their outputs and
errors, the catalogue helpers the playground and the bench need (presets, curated models,
the availability of each choice on this host), and the bench's workloads and measurement
(`measure_engine`, `bench_report`), so the playground measures exactly as `engine.bench` does.
Importable without gradio; code outside `engine/` imports only these names.
"""

from engine.backends.base import StepRecord
from engine.config import (
    CHOICES,
    EngineConfig,
    choice_note,
    list_presets,
    load_preset,
    preset_description,
    tensor_parallel_reason,
    unavailable_reason,
)
from engine.core.metrics import GOODPUT_METRICS, RequestMetrics, check_goodput_slos, describe_device
from engine.core.perplexity import PerplexityResult
from engine.core.request import RequestOutput, StreamDelta
from engine.engine import Engine
from engine.errors import ConfigError, EngineError, ModelLoadError, RequestError
from engine.hub import ModelEntry, list_models
from engine.measure import bench_report, measure_engine
from engine.overrides import parse_sets
from engine.roofline import DeviceCeilings, PhasePoint, RooflineReport, device_ceilings, engine_roofline
from engine.runner.profiler import DecodeProfile
from engine.sampling_params import SamplingParams
from engine.sizing import MemoryEstimate, estimate_memory
from engine.workloads import BenchRequest, WorkloadSpec, build_workload, resolve_dataset

__all__ = ["BenchRequest", "CHOICES", "ConfigError", "DecodeProfile", "DeviceCeilings", "Engine", "EngineConfig",
           "EngineError", "GOODPUT_METRICS", "MemoryEstimate", "ModelEntry", "ModelLoadError", "PerplexityResult",
           "PhasePoint", "RequestError", "RequestMetrics", "RequestOutput", "RooflineReport", "SamplingParams",
           "StepRecord", "StreamDelta", "WorkloadSpec", "bench_report", "build_workload", "check_goodput_slos",
           "choice_note", "describe_device", "device_ceilings", "engine_roofline", "estimate_memory", "list_models",
           "list_presets", "load_preset", "measure_engine", "parse_sets", "preset_description", "resolve_dataset",
           "tensor_parallel_reason", "unavailable_reason"]
