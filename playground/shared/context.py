"""`PlaygroundContext`: what every tab's handlers share, and what they all do with it.

Why one object: every tab needs the same few things (the engine pool, the hosting limits, the curated
models, the device, the default configuration, the presets, the KV cap, the measurement slot, the models' float32
reference perplexities), creates
the same sessions, validates configurations under the same limits and words errors the same way. The context holds them
and knows nothing of the tabs or the page: handlers receive it, and the composition root
(`playground/app.py`) builds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine import AddressPolicy, EngineConfig, ModelEntry
from playground.shared.errors import Refused, describe_error
from playground.shared.measurement_slot import MeasurementSlot
from playground.shared.pool import EnginePool
from playground.shared.reference_perplexity import ReferencePerplexities
from playground.shared.session import Session
from playground.shared.settings import MIB, Settings
from playground.shared.zero_gpu import config_refusal

# Hosting caps (Settings attribute = config field -> its environment variable), enforced in public mode.
CAPPED_FIELDS = {"max_num_seqs": "PLAYGROUND_MAX_NUM_SEQS", "max_num_batched_tokens": "PLAYGROUND_MAX_BATCHED_TOKENS",
                 "max_model_len": "PLAYGROUND_MAX_MODEL_LEN"}


def enforce_caps(config: EngineConfig, settings: Settings, max_kv_cache_bytes: int | None) -> None:
    """Refuse a configuration whose memory-sizing fields exceed the hosting caps (public mode)."""
    for field_name, variable in CAPPED_FIELDS.items():
        cap, value = getattr(settings, field_name), getattr(config, field_name)
        if cap is not None and value is not None and value > cap:
            raise Refused(f"{field_name}={value} is over this server's cap of {cap} ({variable})")
    kv_bytes = config.kv_cache_bytes
    if max_kv_cache_bytes is not None and kv_bytes is not None and kv_bytes > max_kv_cache_bytes:
        raise Refused(f"kv_cache_bytes={kv_bytes / MIB:,.0f} MiB is over this server's cap of "
                      f"{max_kv_cache_bytes / MIB:,.0f} MiB (PLAYGROUND_MAX_KV_CACHE_MIB)")


@dataclass
class StartupCheck:
    """The server's start-up self-check of its default engine (`engine.self_check`), as the header shows it: None
    until it has run."""

    line: str | None = None


@dataclass(frozen=True)
class PlaygroundContext:
    """The engine pool, the hosting limits and the catalogue every tab works with."""

    pool: EnginePool
    settings: Settings
    models: dict[str, ModelEntry]  # the curated models (presets/models.toml), by name
    device: str  # this machine's device, described for the header
    default_config: EngineConfig
    presets: list[str]
    max_kv_cache_bytes: int | None = None  # the cap on one engine's KV cache (public mode)
    measurements: MeasurementSlot = field(default_factory=lambda: MeasurementSlot(max_waiting=8))  # one at a time
    remote_policy: AddressPolicy = field(default_factory=AddressPolicy)  # which servers backend='remote' may call
    startup: StartupCheck = field(default_factory=StartupCheck)
    references: ReferencePerplexities = field(init=False)  # each model's float32 perplexity, measured once

    def __post_init__(self):
        object.__setattr__(self, "references", ReferencePerplexities(self.pool, self.validate))

    @property
    def curated(self) -> list[str]:
        return list(self.models)

    def new_session(self) -> Session:
        return Session(config=self.default_config)

    def session_of(self, session) -> Session:
        """The session Gradio handed over, or a new one for a value that is not a session (an API probe)."""
        return session if isinstance(session, Session) else self.new_session()

    def validate(self, fields: dict) -> EngineConfig:
        """A validated configuration within the hosting limits; raises Refused / EngineError.

        Draft mode without a draft model takes the curated draft paired with the model.
        """
        entry = self.models.get(fields["model"])
        if fields["speculative"] == "draft" and not fields["draft_model"] and entry is not None:
            fields = {**fields, "draft_model": entry.draft}
        config = EngineConfig.from_dict(fields)
        for name in (config.model, config.draft_model):
            refusal = name and self.settings.model_refusal(name)
            if refusal:
                raise Refused(refusal)
        if self.settings.zero_gpu and (refusal := config_refusal(config)):
            raise Refused(refusal)
        if self.settings.public:
            enforce_caps(config, self.settings, self.max_kv_cache_bytes)
        if config.backend == "remote":
            self._check_remote(config)
        return config

    def _check_remote(self, config: EngineConfig) -> None:
        """A served model on a public server: its base URL on the host's allow-list, resolving to an address that
        list allows, and its key's variable one the host names (the client checks the address again on every
        call)."""
        if not self.settings.public:
            return
        if not self.remote_policy.allowed:
            raise Refused("models served elsewhere (backend=remote) are off on this public server: its host allows "
                          "no base URL (PLAYGROUND_REMOTE_ALLOW)")
        key = config.remote_api_key_env
        if key and key not in self.settings.remote_key_envs:
            raise Refused(f"remote_api_key_env={key!r} is not a variable this server sends as an API key "
                          "(PLAYGROUND_REMOTE_KEY_ENVS)")
        self.remote_policy.resolve(config.remote_url)

    def describe(self, error: BaseException) -> str:
        """`error` as one line a visitor may read (server paths hidden in public mode)."""
        return describe_error(error, self.settings.public)
