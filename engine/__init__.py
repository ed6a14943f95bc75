"""A compact LLM serving engine: paged KV cache, continuous batching, prefix caching, streaming.

Public API (docs/architecture.md): `Engine`, `EngineConfig`, `SamplingParams`, their outputs, records
and errors; the plan a configuration resolves to (`plan_engine`) and its memory (`estimate_memory`);
the catalogue helpers the playground and the bench need (presets, curated models, the availability of
each choice on this host); the tools' workloads, measurement, roofline and what-if hardware projection
(`engine/tools/`), so the playground measures exactly as `python -m engine.bench` does; and `open_engine`, which opens
a configuration's engine: an in-process `Engine`, or a model an OpenAI-compatible server serves (`ServedModel` over the
remote client, `engine/remote/`). Importable without gradio; code outside `engine/` imports only these names.
"""

from engine.config import CHOICES, EngineConfig, choice_note, tensor_parallel_reason, unavailable_reason
from engine.core.logprobs import TokenLogprob
from engine.core.metrics import GOODPUT_METRICS, RequestMetrics, check_goodput_slos, describe_device
from engine.core.perplexity import PerplexityResult
from engine.core.request import RequestOutput, StreamDelta
from engine.engine import Engine
from engine.errors import ConfigError, EngineError, ModelLoadError, RemoteError, RequestError
from engine.hub import ModelEntry, hub_repo, list_models, load_tokenizer, resolve_model_path
from engine.info import EngineInfo, EngineStats, StepRecord
from engine.library_logs import drop_unactionable_library_logs
from engine.model.weights import hold_checkpoint, release_checkpoint
from engine.overrides import parse_sets
from engine.plan import EnginePlan, plan_engine
from engine.preload import import_serving_modules
from engine.presets import list_presets, load_preset, preset_description
from engine.prompts import PromptEncoder, encode_prompt
from engine.remote import AddressPolicy, AllowedBase, RemoteEngine, RemoteOutput, RemoteTarget, RemoteTimeouts
from engine.runner.profiler import DecodeProfile
from engine.sampling_params import GUIDED_KINDS, MAX_SPEC_CHARS, MAX_TOP_LOGPROBS, GuidedDecoding, SamplingParams
from engine.serving import open_engine
from engine.sizing import MemoryEstimate, estimate_memory
from engine.tools.export import TARGETS as EXPORT_TARGETS
from engine.tools.export import ExportResult, export_command, format_export
from engine.tools.hardware_projection import HardwareProjection
from engine.tools.measure import bench_report, measure_engine
from engine.tools.roofline import DeviceCeilings, PhasePoint, RooflineReport, device_ceilings, engine_roofline
from engine.tools.self_check import SelfCheck, self_check
from engine.tools.what_if import project_hardware
from engine.tools.workloads import (
    BenchRequest,
    SurgeSpec,
    WorkloadSpec,
    build_workload,
    resolve_dataset,
    surge_requests,
)

drop_unactionable_library_logs()

__all__ = ["AddressPolicy", "AllowedBase", "BenchRequest", "CHOICES", "ConfigError", "DecodeProfile",
           "DeviceCeilings", "EXPORT_TARGETS", "Engine", "EngineConfig", "EngineError", "EngineInfo", "EnginePlan",
           "EngineStats", "ExportResult", "GOODPUT_METRICS", "GUIDED_KINDS", "GuidedDecoding", "HardwareProjection",
           "MAX_SPEC_CHARS", "MAX_TOP_LOGPROBS", "MemoryEstimate", "ModelEntry", "ModelLoadError", "PerplexityResult",
           "PhasePoint", "PromptEncoder", "RemoteEngine", "RemoteError", "RemoteOutput", "RemoteTarget",
           "RemoteTimeouts", "RequestError", "RequestMetrics", "RequestOutput", "RooflineReport", "SamplingParams",
           "SelfCheck", "StepRecord", "StreamDelta", "SurgeSpec", "TokenLogprob", "WorkloadSpec", "bench_report",
           "build_workload", "check_goodput_slos", "choice_note", "describe_device", "device_ceilings",
           "encode_prompt", "engine_roofline", "estimate_memory", "export_command", "format_export",
           "hold_checkpoint", "hub_repo", "import_serving_modules", "list_models", "list_presets", "load_preset",
           "load_tokenizer", "measure_engine", "open_engine", "parse_sets", "plan_engine", "preset_description",
           "project_hardware", "release_checkpoint", "resolve_dataset", "resolve_model_path", "self_check",
           "surge_requests", "tensor_parallel_reason", "unavailable_reason"]
