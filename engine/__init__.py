"""A compact LLM serving engine: paged KV cache, continuous batching, prefix caching, streaming.

Public API: `Engine`, `EngineConfig`, `SamplingParams` (see DESIGN.md). Importable without gradio.
"""

from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import ConfigError, EngineError, ModelLoadError, RequestError
from engine.request import RequestOutput, StreamDelta
from engine.sampling import SamplingParams

__all__ = ["ConfigError", "Engine", "EngineConfig", "EngineError", "ModelLoadError", "RequestError",
           "RequestOutput", "SamplingParams", "StreamDelta"]
