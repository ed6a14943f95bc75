"""Limits for hosting the playground, read once from environment variables.

Why: a public server (a Hugging Face Space, or any bind address other than loopback) is reached by
many people at once, by odd input and by people probing it. Public mode therefore loads only the
curated models unless told otherwise, caps every memory-sizing field of a configuration, caps
messages, conversations, tokens, the queue and the size and duration of Benchmark and Compare runs
(requests, concurrency, tokens in all, request rate, wall-clock time), and never echoes server
paths in errors. Everywhere, request bodies and the time to send them are bounded, and the tokens
one client may have in flight are a share of the server's. On a laptop bound to 127.0.0.1, any
local folder or hub id may be loaded. Remote code is never trusted, whatever the
settings: the engine only reads config.json, tokenizer files and safetensors weights.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

ANY_MODEL = "*"
CURATED = "curated"
LOOPBACK_NAMES = ("localhost", "")
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 64
MAX_SEED = 2**63 - 1
MIB = 1024 * 1024  # the unit of the PLAYGROUND_*_MIB limits and the panel's KV size


def _parsed_env(env: dict, name: str, parse, kind: str):
    """The variable's text parsed by `parse` (None when unset or blank); one error naming it when it does not parse."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return parse(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be {kind}, got {raw!r}") from exc


def _int_env(env: dict, name: str, default: int | None, minimum: int = 1) -> int | None:
    value = _parsed_env(env, name, int, "an integer")
    if value is None:
        return default
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _float_env(env: dict, name: str, default: float | None, zero_allowed: bool = False) -> float | None:
    value = _parsed_env(env, name, float, "a number")
    if value is None:
        return default
    if not (value >= 0 if zero_allowed else value > 0) or value == float("inf"):
        raise ValueError(f"{name} must be a finite number {'>=' if zero_allowed else '>'} 0, "
                         f"got {env[name].strip()!r}")
    return value


def _comma_list(env: dict, name: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in env.get(name, "").split(",") if item.strip())


def is_loopback(host: str) -> bool:
    """Whether a bind address only accepts connections from this machine."""
    host = (host or "").strip().strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Settings:
    """What a visitor may do: which models, how many tokens, how big an engine, how long a queue.

    `allowed_models` is None when any model may be loaded; otherwise a set of model names (the
    curated names and/or hub ids and paths). `curated_only` records that the set was derived from
    presets/models.toml, so the UI can hide the free model field. The `max_*` caps on engine fields
    are None where a field is not capped (the engine's own validation still applies); in public
    mode each has a default. The `max_bench_*` caps bound one Benchmark or Compare run: its
    requests, its requests in flight, and prompt + output tokens over all its requests (each request
    is also held to `max_prompt_tokens` and `max_new_tokens`); in public mode a run's request rate is
    at least `min_bench_rate` per second and it is stopped after `max_measure_seconds` (None: no cap).
    One measurement runs at a time, and at most `max_measure_waiting` sessions wait for it; the chat's "measure"
    action asks one prompt at most `max_measure_repeats` times.

    Every HTTP request's body is at most `max_body_bytes` (413 beyond), its headers must arrive within
    `header_timeout_s` and its body within `body_timeout_s`. The text of one API request (its
    messages or prompts) is at most `max_conversation_chars`, checked before anything is tokenised.
    API calls in flight hold `prompts x n x max_tokens` tokens each: at most `max_tokens_in_flight` over
    all clients and `max_client_tokens_in_flight` for one client (its address, or the last address of
    the `client_address_header` a proxy sets). An API call may ask for at most `max_top_logprobs` alternatives
    per token. A model served elsewhere (backend='remote') is off in public mode unless its base URL is on
    `remote_allow_list` (PLAYGROUND_REMOTE_ALLOW; checked again on the resolved address of every request) and its
    API key's variable, if any, on `remote_key_envs` (PLAYGROUND_REMOTE_KEY_ENVS): a visitor must not choose which
    of this server's secrets is sent where. `warnings` are printed loudly when the server starts.
    """

    allowed_models: frozenset[str] | None = None
    curated_only: bool = False
    max_new_tokens: int = 512
    max_prompt_tokens: int = 4096
    max_message_chars: int = 32_000
    max_queue: int = 32
    max_concurrent_chats: int = 16
    pool_memory_gib: float | None = None
    max_engines: int = 3
    max_kv_cache_mib: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    max_bench_requests: int = 1024
    max_bench_concurrency: int = 256
    max_bench_tokens: int = 4_000_000
    min_bench_rate: float = 0.0
    max_measure_seconds: int | None = None
    max_measure_waiting: int = 8
    max_measure_repeats: int = 20
    max_body_bytes: int = 16 * MIB
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_conversation_chars: int = 128_000
    max_tokens_in_flight: int = 40_960
    max_client_tokens_in_flight: int = 10_240
    client_address_header: str | None = None
    max_top_logprobs: int = 20
    remote_allow_list: tuple[str, ...] = ()
    remote_key_envs: frozenset[str] = frozenset()
    public: bool = False
    on_space: bool = False
    zero_gpu: bool = False
    zero_gpu_max_seconds: int = 120
    warnings: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, curated_models: list[str], env: dict | None = None) -> Settings:
        """Read PLAYGROUND_* variables; `curated_models` are the names in presets/models.toml.

        Public mode: on a Space (SPACE_ID), when GRADIO_SERVER_NAME is not a loopback address, or
        with PLAYGROUND_PUBLIC=1. PLAYGROUND_ALLOWED_MODELS: comma list of model names / hub ids /
        paths; `curated` stands for the curated list and `*` for anything. Unset: curated only in
        public mode, anything on a loopback-only laptop.
        """
        env = dict(os.environ if env is None else env)
        on_space = bool(env.get("SPACE_ID"))
        bind = env.get("GRADIO_SERVER_NAME", "127.0.0.1")
        exposed = not is_loopback(bind)
        public = on_space or exposed or env.get("PLAYGROUND_PUBLIC", "").strip().lower() in ("1", "true", "yes")
        raw = env.get("PLAYGROUND_ALLOWED_MODELS", "").strip()
        items = [item.strip() for item in raw.split(",") if item.strip()]
        warnings = []
        if not items:
            items = [CURATED] if public else [ANY_MODEL]
            if exposed and not on_space:
                warnings.append(f"GRADIO_SERVER_NAME={bind} accepts connections from other machines and "
                                "PLAYGROUND_ALLOWED_MODELS is not set: only the curated models may be loaded "
                                "(set PLAYGROUND_ALLOWED_MODELS='*' to allow any local folder or hub id)")
        if ANY_MODEL in items:
            allowed, curated_only = None, False
            if public:
                warnings.append("PLAYGROUND_ALLOWED_MODELS='*' on a public server: anyone who reaches it can "
                                "load any local folder of this machine and download any hub model")
        else:
            names = set()
            for item in items:
                names.update(curated_models if item == CURATED else [item])
            allowed = frozenset(names)
            curated_only = names <= set(curated_models)
        max_new_tokens = _int_env(env, "PLAYGROUND_MAX_NEW_TOKENS", 256 if public else 512)
        max_queue = _int_env(env, "PLAYGROUND_MAX_QUEUE", 32 if public else 64)
        max_concurrent_chats = _int_env(env, "PLAYGROUND_MAX_CONCURRENT_CHATS", 16)
        tokens_in_flight = _int_env(env, "PLAYGROUND_MAX_TOKENS_IN_FLIGHT",
                                    (max_concurrent_chats + max_queue) * max_new_tokens)
        header = env.get("PLAYGROUND_CLIENT_ADDRESS_HEADER", "x-forwarded-for" if on_space else "").strip().lower()
        return cls(
            allowed_models=allowed,
            curated_only=curated_only,
            max_new_tokens=max_new_tokens,
            max_prompt_tokens=_int_env(env, "PLAYGROUND_MAX_PROMPT_TOKENS", 2048 if public else 4096),
            max_message_chars=_int_env(env, "PLAYGROUND_MAX_MESSAGE_CHARS", 8_000 if public else 32_000),
            max_queue=max_queue,
            max_concurrent_chats=max_concurrent_chats,
            pool_memory_gib=_float_env(env, "PLAYGROUND_POOL_MEMORY_GIB", None),
            max_engines=_int_env(env, "PLAYGROUND_MAX_ENGINES", 2 if public else 3),
            max_kv_cache_mib=_int_env(env, "PLAYGROUND_MAX_KV_CACHE_MIB", None),
            max_num_seqs=_int_env(env, "PLAYGROUND_MAX_NUM_SEQS", 64 if public else None),
            max_num_batched_tokens=_int_env(env, "PLAYGROUND_MAX_BATCHED_TOKENS", 8192 if public else None),
            max_model_len=_int_env(env, "PLAYGROUND_MAX_MODEL_LEN", 8192 if public else None, minimum=2),
            max_bench_requests=_int_env(env, "PLAYGROUND_MAX_BENCH_REQUESTS", 64 if public else 1024),
            max_bench_concurrency=_int_env(env, "PLAYGROUND_MAX_BENCH_CONCURRENCY", 16 if public else 256),
            max_bench_tokens=_int_env(env, "PLAYGROUND_MAX_BENCH_TOKENS", 65_536 if public else 4_000_000),
            min_bench_rate=_float_env(env, "PLAYGROUND_MIN_BENCH_RATE", 1.0 if public else 0.0, zero_allowed=True),
            max_measure_seconds=_int_env(env, "PLAYGROUND_MAX_MEASURE_SECONDS", 120 if public else 0, minimum=0)
            or None,
            max_measure_waiting=_int_env(env, "PLAYGROUND_MAX_MEASURE_WAITING", 8),
            max_measure_repeats=_int_env(env, "PLAYGROUND_MAX_MEASURE_REPEATS", 5 if public else 20, minimum=2),
            max_body_bytes=_int_env(env, "PLAYGROUND_MAX_BODY_MIB", 4 if public else 16) * MIB,
            header_timeout_s=_float_env(env, "PLAYGROUND_HEADER_TIMEOUT_S", 10.0),
            body_timeout_s=_float_env(env, "PLAYGROUND_BODY_TIMEOUT_S", 30.0),
            max_conversation_chars=_int_env(env, "PLAYGROUND_MAX_CONVERSATION_CHARS",
                                            32_000 if public else 128_000),
            max_tokens_in_flight=tokens_in_flight,
            max_client_tokens_in_flight=_int_env(env, "PLAYGROUND_MAX_CLIENT_TOKENS_IN_FLIGHT",
                                                 max(1, tokens_in_flight // 4)),
            client_address_header=header or None,
            max_top_logprobs=min(20, _int_env(env, "PLAYGROUND_MAX_TOP_LOGPROBS", 5 if public else 20, minimum=0)),
            remote_allow_list=_comma_list(env, "PLAYGROUND_REMOTE_ALLOW"),
            remote_key_envs=frozenset(_comma_list(env, "PLAYGROUND_REMOTE_KEY_ENVS")),
            public=public,
            on_space=on_space,
            zero_gpu=(env.get("SPACES_ZERO_GPU", "").strip().lower() in ("1", "t", "true")
                      or env.get("PLAYGROUND_ZEROGPU", "").strip().lower() in ("1", "true", "yes")),
            zero_gpu_max_seconds=_int_env(env, "PLAYGROUND_ZEROGPU_MAX_SECONDS", 120),
            warnings=tuple(warnings),
        )

    def model_refusal(self, model: str) -> str | None:
        """Why `model` may not be loaded here, or None if it may."""
        if self.allowed_models is None or model in self.allowed_models:
            return None
        allowed = ", ".join(sorted(self.allowed_models))
        return (f"model {model!r} is not allowed on this server (PLAYGROUND_ALLOWED_MODELS); "
                f"allowed: {allowed}")
