"""Each model's float32 reference perplexity: measured once per app, then shown beside every perplexity figure.

Why: a perplexity alone says little (the demo's 222 reads as a number, not as "double the model's own"); beside
the same model's unquantized float32 figure on the same held-out text it says what a configuration costs. The
reference is the model's defaults in float32 on the same device (no quantization, native KV heads and KV dtype),
leased from the shared pool like any engine, so the memory budget applies.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from engine import EngineConfig, PerplexityResult
from playground.shared.configs import default_config


class ReferencePerplexities:
    """Model -> its float32 reference perplexity, measured at most once each."""

    def __init__(self, pool, validate: Callable[[dict], EngineConfig]):
        self.pool = pool
        self.validate = validate
        self._results: dict[str, PerplexityResult] = {}
        self._lock = threading.Lock()  # one measurement at a time, so a model is never measured twice

    def reference_config(self, config: EngineConfig) -> EngineConfig:
        return self.validate({**default_config(config.model), "device": config.device, "dtype": "float32"})

    def cached(self, model: str) -> PerplexityResult | None:
        return self._results.get(model)

    def measure(self, config: EngineConfig, progress: Callable[[int, int], None] | None = None) -> PerplexityResult:
        """The reference of `config`'s model: the cached one, or measured now through the pool."""
        with self._lock:
            if config.model not in self._results:
                with self.pool.lease(self.reference_config(config)) as entry:
                    self._results[config.model] = entry.engine.perplexity(progress=progress)
            return self._results[config.model]
