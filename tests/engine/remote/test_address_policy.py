"""The public mode's address policy: the allow-list of base URLs, private addresses refused unless an entry opts in,
checked when a request is sent and again on the connected socket (a name rebound between the check and the connect
is refused before a byte is sent)."""

from __future__ import annotations

import socket

import pytest

from engine import SamplingParams
from engine.errors import RemoteError
from engine.remote import AddressPolicy, AllowedBase, RemoteEngine, RemoteTarget, RemoteTimeouts
from engine.remote.policy import blocked_reason
from tests.support.misbehaving_server import MODEL, MisbehavingServer

FAST = RemoteTimeouts(connect=1.0, first_token=2.0, inter_token=2.0, retries=0)
PUBLIC_ADDRESS = "93.184.216.34"


@pytest.mark.parametrize(("address", "reason"), [
    ("169.254.169.254", "cloud metadata"), ("169.254.1.1", "link-local"), ("127.0.0.1", "loopback"),
    ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"), ("10.1.2.3", "private"), ("192.168.0.1", "private"),
    ("fd00::1", "private"), ("224.0.0.1", "multicast"), ("0.0.0.0", "unspecified"),
    ("100.64.0.1", "not globally routable"), ("240.0.0.1", "reserved"), (PUBLIC_ADDRESS, None),
    ("2606:4700::1111", None)])
def test_which_addresses_are_public(address, reason):
    assert blocked_reason(address) == reason


def test_a_base_url_must_lie_under_an_allow_list_entry():
    policy = AddressPolicy(public=True, allowed=(AllowedBase("https://api.example.com:8443/v1"),))
    for url in ("https://api.example.com:8443/v1", "https://API.example.com:8443/v1/", "https://api.example.com:8443/v1/x"):
        assert policy.entry_for(url) is policy.allowed[0]
    for url in ("http://api.example.com:8443/v1", "https://api.example.com/v1", "https://api.example.com:8443/v10",
                "https://api.example.com:8443/", "https://other.example.com:8443/v1"):
        with pytest.raises(RemoteError, match="not on this server's list of allowed base URLs") as refused:
            policy.entry_for(url)
        assert refused.value.kind == "address"
    with pytest.raises(RemoteError, match="allowed base URLs"):
        RemoteEngine(RemoteTarget("http://127.0.0.1:9/v1", MODEL), FAST, policy)
    assert AddressPolicy.local().entry_for("http://127.0.0.1:9/v1") is None


def test_a_private_address_is_refused_in_public_mode_unless_its_entry_opts_in():
    with MisbehavingServer("ok") as server:
        target = RemoteTarget(server.base_url, MODEL)
        refused = AddressPolicy(public=True, allowed=(AllowedBase(server.base_url),))
        with RemoteEngine(target, FAST, refused) as remote:
            output = remote.submit("Say hi", SamplingParams(max_tokens=5)).result()
            with pytest.raises(RemoteError, match="127.0.0.1, a loopback address"):
                remote.describe()
        assert output.finish_reason == "error" and "127.0.0.1 resolves to 127.0.0.1, a loopback address" in output.error
        assert server.requests == []
        opted_in = AddressPolicy(public=True, allowed=(AllowedBase(server.base_url, private=True),))
        with RemoteEngine(target, FAST, opted_in) as remote:
            assert remote.submit("Say hi", SamplingParams(max_tokens=5)).result().text == "Hello, world! Bye"
        with RemoteEngine(target, FAST) as remote:  # local mode
            assert remote.submit("Say hi", SamplingParams(max_tokens=5)).result().finish_reason == "length"


def test_a_name_rebound_to_a_private_address_after_the_check_is_refused_on_the_connected_socket(monkeypatch):
    """The name resolves to a public address when the policy checks it, and to 127.0.0.1 when the client connects:
    the connection's peer is checked before the request is written, so the server never sees it."""
    real = socket.getaddrinfo
    answers = iter([PUBLIC_ADDRESS])

    def rebinding(host, port, *args, **kwargs):
        if host != "rebind.test":
            return real(host, port, *args, **kwargs)
        address = next(answers, "127.0.0.1")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    with MisbehavingServer("ok") as server:
        base = server.base_url.replace("127.0.0.1", "rebind.test")
        policy = AddressPolicy(public=True, allowed=(AllowedBase(base),))
        with RemoteEngine(RemoteTarget(base, MODEL), FAST, policy) as remote:
            output = remote.submit("Say hi", SamplingParams(max_tokens=5)).result()
        assert output.finish_reason == "error" and "rebind.test resolves to 127.0.0.1, a loopback" in output.error
        assert server.requests == []
