"""Errors a user can cause. Each carries one clear message and leaves a running engine untouched."""


class EngineError(ValueError):
    """Base class for every error the engine reports to its caller."""


class ConfigError(EngineError):
    """A bad configuration value or an impossible combination of values."""


class ModelLoadError(EngineError):
    """The model could not be resolved, read or built (unknown id, unsupported architecture...)."""


class RequestError(EngineError):
    """A request the engine cannot serve (prompt too long, bad sampling values, engine closed)."""
