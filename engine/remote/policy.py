"""Which servers a public deployment may call: an allow-list of base URLs, and no private address behind them.

Why: in public mode the people typing a server's URL are strangers, and the playground's host is inside someone's
network. A URL is allowed only when it lies under an allow-list entry (same scheme, host and port, and a path under
the entry's path), and every address its host resolves to is public: not loopback, private, link-local (the cloud
metadata address 169.254.169.254 among them), reserved, multicast or otherwise not globally routable, unless the
entry opts in (`private=True`). The addresses are checked when each request is sent, and the connection is checked
again on the socket's peer address once it is made (`check_peer`), so a name that resolves to a public address for
the check and a private one for the connection (DNS rebinding) is refused before a byte is sent. Local mode
(`AddressPolicy.local()`) allows anything.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import httpx

from engine.errors import RemoteError

METADATA_ADDRESSES = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})


@dataclass(frozen=True)
class AllowedBase:
    """One allow-list entry: a base URL (scheme, host, port, path prefix) and whether its host may be private."""

    url: str
    private: bool = False

    def covers(self, url: httpx.URL) -> bool:
        mine = httpx.URL(self.url)
        prefix = mine.path.rstrip("/")
        return ((mine.scheme, mine.host.lower(), mine.port) == (url.scheme, url.host.lower(), url.port)
                and (url.path == prefix or url.path.startswith(prefix + "/") or not prefix))


def blocked_reason(address: str) -> str | None:
    """Why `address` is not a public one, as an adjective ("loopback"), or None when it is."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for reason, hit in (("cloud metadata", ip in METADATA_ADDRESSES), ("loopback", ip.is_loopback),
                        ("link-local", ip.is_link_local), ("unspecified", ip.is_unspecified),
                        ("multicast", ip.is_multicast), ("reserved", ip.is_reserved), ("private", ip.is_private),
                        ("not globally routable", not ip.is_global)):
        if hit:
            return reason
    return None


@dataclass(frozen=True)
class AddressPolicy:
    """`public=False`: anything goes. `public=True`: only URLs under `allowed`, on public addresses unless the entry
    opts in."""

    public: bool = False
    allowed: tuple[AllowedBase, ...] = ()

    @classmethod
    def local(cls) -> AddressPolicy:
        return cls()

    def entry_for(self, url: str) -> AllowedBase | None:
        """The allow-list entry `url` lies under (None in local mode); RemoteError(kind="address") when none."""
        if not self.public:
            return None
        parsed = httpx.URL(url)
        for entry in self.allowed:
            if entry.covers(parsed):
                return entry
        raise RemoteError(f"{parsed.scheme}://{parsed.host}:{parsed.port}{parsed.path} is not on this server's list "
                          "of allowed base URLs", "address")

    def resolve(self, url: str) -> None:
        """Resolve `url`'s host now and refuse it if any of its addresses is not allowed (public mode only)."""
        entry = self.entry_for(url)
        if entry is None or entry.private:
            return
        parsed = httpx.URL(url)
        try:
            infos = socket.getaddrinfo(parsed.host, parsed.port, type=socket.SOCK_STREAM)
        except OSError as error:
            raise RemoteError(f"cannot resolve {parsed.host}: {error}", "unreachable") from None
        for info in infos:
            self._refuse(parsed.host, info[4][0])

    def check_peer(self, url: str, peer_address: str) -> None:
        """Refuse a connection made for `url` whose socket's peer is not allowed (public mode only)."""
        entry = self.entry_for(url)
        if entry is not None and not entry.private:
            self._refuse(httpx.URL(url).host, peer_address)

    @staticmethod
    def _refuse(host: str, address: str) -> None:
        reason = blocked_reason(address)
        if reason:
            raise RemoteError(f"{host} resolves to {address}, a {reason} address, which this server does not call "
                              "(its allow-list entry does not opt in to private addresses)", "address")
