"""A model served elsewhere on a public server: off unless the host allows its base URL, on an address that list
allows, with an API-key variable the host names; anything on a laptop."""

from __future__ import annotations

import pytest

from engine import EngineConfig, EngineError
from playground.app import create_playground
from playground.shared.errors import Refused
from playground.shared.settings import Settings

PUBLIC_IP_URL = "http://93.184.216.34:8000/v1"  # a public address, numeric: nothing is looked up


def context(env: dict):
    return create_playground(Settings.from_env(["demo"], env=env))


def served(url: str, key: str = "") -> dict:
    return {**EngineConfig().to_dict(), "backend": "remote", "remote_url": url, "remote_model": "demo",
            "remote_api_key_env": key}


def test_a_laptop_may_reach_any_server():
    assert context({}).validate(served("http://127.0.0.1:8000/v1", "ANY_KEY")).backend == "remote"


def test_a_public_server_reaches_only_the_allowed_urls_on_allowed_addresses_with_allowed_keys():
    with pytest.raises(Refused, match="PLAYGROUND_REMOTE_ALLOW"):
        context({"PLAYGROUND_PUBLIC": "1"}).validate(served(PUBLIC_IP_URL))
    public = context({"PLAYGROUND_PUBLIC": "1", "PLAYGROUND_REMOTE_ALLOW": f"{PUBLIC_IP_URL}, http://127.0.0.1:9000/v1",
                      "PLAYGROUND_REMOTE_KEY_ENVS": "SERVER_KEY"})
    assert public.validate(served(PUBLIC_IP_URL, "SERVER_KEY")).remote_url == PUBLIC_IP_URL
    with pytest.raises(EngineError, match="not on this server's list"):
        public.validate(served("http://93.184.216.35:8000/v1"))
    with pytest.raises(EngineError, match="loopback"):  # allow-listed, but a private address without opting in
        public.validate(served("http://127.0.0.1:9000/v1"))
    with pytest.raises(Refused, match="HF_TOKEN"):  # a visitor may not choose which secret is sent
        public.validate(served(PUBLIC_IP_URL, "HF_TOKEN"))
    private = context({"PLAYGROUND_PUBLIC": "1", "PLAYGROUND_REMOTE_ALLOW": "private=http://10.0.0.5:8000/v1"})
    assert private.validate(served("http://10.0.0.5:8000/v1")).remote_url == "http://10.0.0.5:8000/v1"
