"""Pre-quantized checkpoints (GPTQ, AWQ, ...): recognised from config.json, served only where they can be.

Such a checkpoint stores packed integer weights that only its own kernels read. The native engine
loads full-precision checkpoints (and quantizes them itself), so these go to the transformers
backend, on a CUDA GPU, with the package of their method installed; anywhere else, one clear error.
"""

from __future__ import annotations

from engine.errors import ConfigError


def prequantized_method(hf_config) -> str | None:
    """The `quant_method` of a checkpoint's `quantization_config` ("gptq", "awq", ...), or None."""
    quantization = getattr(hf_config, "quantization_config", None)
    if quantization is None:
        return None
    method = quantization.get("quant_method") if isinstance(quantization, dict) else getattr(
        quantization, "quant_method", None)
    return str(getattr(method, "value", method) or "unknown")


def check_prequantized(method: str, device: str, quantization: str) -> None:
    """Refuse a pre-quantized checkpoint on a CPU, or with a second quantization on top."""
    if quantization != "none":
        raise ConfigError(f"this checkpoint is already quantized ({method}); set quantization='none'")
    if device != "cuda":
        raise ConfigError(f"this checkpoint is pre-quantized ({method}): its kernels need a CUDA GPU "
                          "(load a full-precision checkpoint and pick a quantization level instead)")
