"""A careful client for any OpenAI-compatible server, behind the calls a local `Engine` takes (docs/remote.md)."""

from engine.remote.engine import RemoteEngine
from engine.remote.policy import AddressPolicy, AllowedBase
from engine.remote.server_metrics import ServerFigure
from engine.remote.stream import RemoteHandle, RemoteOutput
from engine.remote.target import RemoteTarget, RemoteTimeouts

__all__ = ["AddressPolicy", "AllowedBase", "RemoteEngine", "RemoteHandle", "RemoteOutput", "RemoteTarget",
           "RemoteTimeouts", "ServerFigure"]
