"""Errors a user can cause. Each carries one clear message and leaves a running engine untouched."""


class EngineError(ValueError):
    """Base class for every error the engine reports to its caller."""


class ConfigError(EngineError):
    """A bad configuration value or an impossible combination of values."""


class ModelLoadError(EngineError):
    """The model could not be resolved, read or built (unknown id, unsupported architecture...)."""


class RequestError(EngineError):
    """A request the engine cannot serve (prompt too long, bad sampling values, engine closed)."""


class RemoteError(EngineError):
    """A remote OpenAI-compatible server failed a call (`engine/remote/`): one message per failure, and `kind` naming
    which for a caller that branches on it: "unreachable", "auth", "unknown_model", "http", "redirect", "dropped",
    "first_token_timeout", "inter_token_timeout", "bad_reply" or "address" (refused by the address policy)."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind
