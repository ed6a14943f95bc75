"""Which server and model a `RemoteEngine` talks to, and how long it waits: frozen, so a target can key a pool.

The API key is never a field: `api_key_env` names the environment variable that holds it, read when a call is sent,
so no repr, log line or page ever shows the key itself.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import httpx

from engine.errors import ConfigError


@dataclass(frozen=True)
class RemoteTarget:
    """An OpenAI-compatible server's base URL (e.g. `http://host:8000/v1`), the model it serves, and the name of the
    environment variable holding its API key (None: no key is sent)."""

    base_url: str
    model: str
    api_key_env: str | None = None

    def __post_init__(self):
        try:
            url = httpx.URL(self.base_url)
        except (httpx.InvalidURL, TypeError) as error:
            raise ConfigError(f"the base URL {self.base_url!r} is not a URL ({error})") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigError(f"the base URL must be http:// or https:// with a host, got {self.base_url!r}")
        if url.userinfo or url.query or url.fragment:
            raise ConfigError("the base URL takes no user name, password, query or fragment: the key goes in "
                              "api_key_env")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError("the remote model must be a non-empty model id")
        if self.api_key_env is not None and not (isinstance(self.api_key_env, str) and self.api_key_env.isidentifier()):
            raise ConfigError(f"api_key_env must name an environment variable, got {self.api_key_env!r}")
        object.__setattr__(self, "base_url", str(url).rstrip("/"))

    def url(self, path: str) -> str:
        """`path` (e.g. "/models") under the base URL."""
        return self.base_url + path

    @property
    def server_root(self) -> str:
        """The base URL without its trailing `/v1`: where servers put `/metrics` (the origin when there is no /v1)."""
        if self.base_url.endswith("/v1"):
            return self.base_url[:-len("/v1")]
        url = httpx.URL(self.base_url)
        return str(url.copy_with(raw_path=b"/")).rstrip("/")

    def api_key(self) -> str | None:
        """The key, read now from `api_key_env`; None without a variable, or when it is unset or empty."""
        return (os.environ.get(self.api_key_env) or None) if self.api_key_env else None


@dataclass(frozen=True)
class RemoteTimeouts:
    """Seconds a call may take, each bound apart: to connect, from sending to the first streamed text, and between
    two streamed texts (or from the last one to the end). `retries`: attempts added when a connection fails before
    any byte of a response (never once bytes arrived)."""

    connect: float = 10.0
    first_token: float = 120.0
    inter_token: float = 60.0
    retries: int = 2

    def __post_init__(self):
        for name in ("connect", "first_token", "inter_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ConfigError(f"the {name.replace('_', '-')} timeout must be a positive number of seconds, "
                                  f"got {value!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or not 0 <= self.retries <= 10:
            raise ConfigError(f"retries must be an integer from 0 to 10, got {self.retries!r}")
