"""Hosting limits read from the environment, and errors that never echo a server's paths in public mode."""

from __future__ import annotations

import pytest

from engine import RequestError
from playground.shared.errors import describe_error, redact_paths
from playground.shared.settings import Settings


def test_settings_default_to_curated_models_on_a_space():
    settings = Settings.from_env(["demo", "smollm"], env={"SPACE_ID": "me/playground"})
    assert settings.public and settings.curated_only and settings.allowed_models == {"demo", "smollm"}
    assert settings.model_refusal("evil/model") and settings.model_refusal("demo") is None
    assert settings.max_num_seqs == 64 and settings.max_message_chars == 8000
    local = Settings.from_env(["demo"], env={})
    assert not local.public and local.allowed_models is None and local.model_refusal("any/model") is None


def test_binding_beyond_loopback_defaults_to_the_curated_list_and_warns():
    exposed = Settings.from_env(["demo"], env={"GRADIO_SERVER_NAME": "0.0.0.0"})
    assert exposed.public and exposed.allowed_models == {"demo"}
    assert any("only the curated models" in w for w in exposed.warnings)
    anything = Settings.from_env(["demo"], env={"GRADIO_SERVER_NAME": "0.0.0.0", "PLAYGROUND_ALLOWED_MODELS": "*"})
    assert anything.allowed_models is None and any("any local folder" in w for w in anything.warnings)
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        loopback = Settings.from_env(["demo"], env={"GRADIO_SERVER_NAME": host})
        assert not loopback.public and not loopback.warnings and loopback.allowed_models is None


def test_settings_read_limits_from_environment():
    env = {"PLAYGROUND_ALLOWED_MODELS": "curated, org/extra", "PLAYGROUND_MAX_NEW_TOKENS": "64",
           "PLAYGROUND_MAX_PROMPT_TOKENS": "300", "PLAYGROUND_MAX_QUEUE": "5", "PLAYGROUND_MAX_KV_CACHE_MIB": "64",
           "PLAYGROUND_MAX_MESSAGE_CHARS": "1000"}
    settings = Settings.from_env(["demo"], env=env)
    assert settings.allowed_models == {"demo", "org/extra"} and not settings.curated_only
    assert (settings.max_new_tokens, settings.max_prompt_tokens, settings.max_queue) == (64, 300, 5)
    assert (settings.max_kv_cache_mib, settings.max_message_chars) == (64, 1000)
    with pytest.raises(ValueError, match="PLAYGROUND_MAX_QUEUE"):
        Settings.from_env([], env={"PLAYGROUND_MAX_QUEUE": "lots"})
    with pytest.raises(ValueError, match="PLAYGROUND_POOL_MEMORY_GIB"):
        Settings.from_env([], env={"PLAYGROUND_POOL_MEMORY_GIB": "nan"})


def test_bodies_conversations_and_tokens_in_flight_are_bounded():
    public = Settings.from_env(["demo"], env={"PLAYGROUND_PUBLIC": "1"})
    assert (public.max_body_bytes, public.max_conversation_chars) == (4 * 2**20, 32_000)
    assert (public.header_timeout_s, public.body_timeout_s) == (10.0, 30.0)
    assert public.max_tokens_in_flight == (16 + 32) * 256 and public.max_client_tokens_in_flight == 48 * 256 // 4
    assert Settings.from_env(["demo"], env={}).client_address_header is None
    assert Settings.from_env(["demo"], env={"SPACE_ID": "me/x"}).client_address_header == "x-forwarded-for"
    env = {"PLAYGROUND_MAX_BODY_MIB": "2", "PLAYGROUND_HEADER_TIMEOUT_S": "3", "PLAYGROUND_BODY_TIMEOUT_S": "4",
           "PLAYGROUND_MAX_CONVERSATION_CHARS": "5000", "PLAYGROUND_MAX_TOKENS_IN_FLIGHT": "900",
           "PLAYGROUND_MAX_CLIENT_TOKENS_IN_FLIGHT": "300", "PLAYGROUND_CLIENT_ADDRESS_HEADER": "X-Real-IP"}
    settings = Settings.from_env(["demo"], env=env)
    assert (settings.max_body_bytes, settings.header_timeout_s, settings.body_timeout_s) == (2 * 2**20, 3.0, 4.0)
    assert (settings.max_conversation_chars, settings.max_tokens_in_flight, settings.max_client_tokens_in_flight) == (
        5000, 900, 300)
    assert settings.client_address_header == "x-real-ip"
    with pytest.raises(ValueError, match="PLAYGROUND_BODY_TIMEOUT_S"):
        Settings.from_env([], env={"PLAYGROUND_BODY_TIMEOUT_S": "0"})


def test_measurements_are_bounded_in_public_mode():
    public = Settings.from_env(["demo"], env={"PLAYGROUND_PUBLIC": "1"})
    assert (public.min_bench_rate, public.max_measure_seconds, public.max_measure_waiting) == (1.0, 120, 8)
    laptop = Settings.from_env(["demo"], env={})
    assert (laptop.min_bench_rate, laptop.max_measure_seconds) == (0.0, None)
    settings = Settings.from_env(["demo"], env={"PLAYGROUND_PUBLIC": "1", "PLAYGROUND_MIN_BENCH_RATE": "0.5",
                                                "PLAYGROUND_MAX_MEASURE_SECONDS": "0",
                                                "PLAYGROUND_MAX_MEASURE_WAITING": "3"})
    assert (settings.min_bench_rate, settings.max_measure_seconds, settings.max_measure_waiting) == (0.5, None, 3)
    with pytest.raises(ValueError, match="PLAYGROUND_MIN_BENCH_RATE"):
        Settings.from_env([], env={"PLAYGROUND_MIN_BENCH_RATE": "-1"})


def test_public_errors_do_not_echo_server_paths():
    error = RequestError("cannot read the model config in /srv/secret/models/x: no config.json")
    assert describe_error(error, public=True) == "cannot read the model config in x: no config.json"
    assert "/srv/secret" in describe_error(error, public=False)
    assert describe_error(ValueError("bad /home/me/.cache/a.bin"), public=True) == "ValueError: bad a.bin"
    assert redact_paths("tokens / s, KV/16, https://hf.co/org/name and org/name") == \
        "tokens / s, KV/16, https://hf.co/org/name and org/name"
