"""The HTTP side of a remote engine: httpx, configured to be careful, and each failure named once.

What it does and why:
- one call, one connection (no keep-alive pool): the trace hook sees every connection being made, so its socket can
  be checked against the address policy (`AddressPolicy.check_peer`, on the connected peer: the address checked is
  the address used) and cut by a deadline or a cancel (`Call.end` shuts it down, which wakes a blocked read); TTFT
  then includes the connect, as vLLM's own benchmark client measures it;
- no redirects (a 3xx is an error naming its Location: a server may not send the key or the prompt elsewhere), no
  proxy or .netrc from the environment (`trust_env=False`: a proxy would hide the peer the policy checks);
- retries only before a response: a connect that fails, or a connection closed or reset before the status line
  arrived; never once a response began, never after a deadline or a cancel;
- the key as a Bearer header, read from the target's environment variable for each call, never in a message.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx

from engine.errors import RemoteError
from engine.remote.policy import AddressPolicy
from engine.remote.target import RemoteTarget, RemoteTimeouts
from engine.remote.watchdog import Watchdog

ERROR_BODY_BYTES = 4096
RETRY_PAUSE_S = 0.2


class Call:
    """One call's connection, as its trace hook saw it made, so that another thread can end it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self.ended_by: str | None = None

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._socket = sock
            ended = self.ended_by is not None
        if ended:
            _shut(sock)

    def end(self, reason: str) -> None:
        """End the call for `reason` (the first reason given stands): its socket is shut down now, or when made."""
        with self._lock:
            if self.ended_by is not None:
                return
            self.ended_by = reason
            sock = self._socket
        if sock is not None:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed by its reader
        pass


def _before_response(error: httpx.HTTPError) -> bool:
    """Whether the attempt failed before any response arrived (so that sending it again is safe to try)."""
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
        return True
    return ((isinstance(error, httpx.RemoteProtocolError) and "without sending a response" in str(error))
            or (isinstance(error, httpx.ReadError) and "reset" in str(error).lower()))


class RemoteClient:
    """Sends calls to one target under one address policy; `send` streams, `get_json` reads a small reply."""

    def __init__(self, target: RemoteTarget, timeouts: RemoteTimeouts, policy: AddressPolicy, watchdog: Watchdog):
        policy.entry_for(target.base_url)  # refused now rather than at the first call
        self.target, self.timeouts, self.policy, self.watchdog = target, timeouts, policy, watchdog
        backstop = max(timeouts.first_token, timeouts.inter_token) + timeouts.connect  # the watchdog ends a call first
        self._client = httpx.Client(
            timeout=httpx.Timeout(connect=timeouts.connect, read=backstop, write=timeouts.connect,
                                  pool=timeouts.connect),
            follow_redirects=False, trust_env=False,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0))  # as many as the caller sends

    def send(self, method: str, url: str, call: Call, body: dict | None = None) -> httpx.Response:
        """The response, streaming, once its status is a success; RemoteError for any other status, httpx's error
        when the connection failed (after the retries allowed before a response)."""
        for attempt in range(self.timeouts.retries + 1):
            self.policy.resolve(url)
            request = self._client.build_request(method, url, json=body, headers=self._headers(),
                                                 extensions={"trace": self._tracer(url, call)})
            try:
                response = self._client.send(request, stream=True)
            except httpx.HTTPError as error:
                if call.ended_by is None and attempt < self.timeouts.retries and _before_response(error):
                    time.sleep(RETRY_PAUSE_S * (attempt + 1))
                    continue
                raise
            self._check(response, url)
            return response
        raise AssertionError("unreachable: the last attempt returns or raises")

    def get_text(self, url: str) -> str:
        """A small reply's text, whole within the first-token timeout (RemoteError for a failed status, an
        unreachable server or the timeout)."""
        call = Call()
        self.watchdog.arm(call, time.monotonic() + self.timeouts.first_token, lambda: call.end("first_token_timeout"))
        try:
            response = self.send("GET", url, call)
            try:
                return response.read().decode(errors="replace")
            finally:
                response.close()
        except httpx.HTTPError as error:
            if call.ended_by is not None:
                raise RemoteError(f"{url} sent no whole reply within the first-token timeout "
                                  f"({self.timeouts.first_token:g} s)", "first_token_timeout") from None
            raise self.unreachable(error) from None
        finally:
            self.watchdog.disarm(call)

    def get_json(self, url: str):
        """A small JSON reply (RemoteError as `get_text`, and for a body that is not JSON)."""
        text = self.get_text(url)
        try:
            return json.loads(text)
        except ValueError:
            raise RemoteError(f"{url} answered with a body that is not JSON: {text[:120]!r}", "bad_reply") from None

    def unreachable(self, error: httpx.HTTPError) -> RemoteError:
        return RemoteError(f"cannot reach {self.target.base_url}: {type(error).__name__}: {error}", "unreachable")

    def close(self) -> None:
        self._client.close()

    def _headers(self) -> dict:
        key = self.target.api_key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _tracer(self, url: str, call: Call):
        """httpcore's trace hook for one call: the new connection's peer checked before anything is written, and its
        socket handed to `call` (again once TLS wraps it: wrapping detaches the plain socket object)."""
        def trace(event: str, info: dict) -> None:
            if event == "connection.connect_tcp.complete":
                stream = info["return_value"]
                try:
                    self.policy.check_peer(url, stream.get_extra_info("server_addr")[0])
                except RemoteError:
                    stream.close()
                    raise
                call.attach(stream.get_extra_info("socket"))
            elif event == "connection.start_tls.complete":
                call.attach(info["return_value"].get_extra_info("socket"))
        return trace

    def _check(self, response: httpx.Response, url: str) -> None:
        status = response.status_code
        if status < 300:
            return
        message = _server_message(response)
        response.close()
        if status < 400:
            raise RemoteError(f"{url} answered {status}, redirecting to {response.headers.get('location', '?')}: "
                              "redirects are not followed (use that URL as the base URL if you trust it)", "redirect")
        if status in (401, 403):
            raise RemoteError(self._auth_message(status, message), "auth")
        if status == 404 and ("model" in message.lower() or url.startswith(self.target.url("/models/"))):
            raise RemoteError(f"{self.target.base_url} does not serve the model {self.target.model!r}: {message}",
                              "unknown_model")
        raise RemoteError(f"{url} answered HTTP {status}: {message}", "http")

    def _auth_message(self, status: int, message: str) -> str:
        env = self.target.api_key_env
        said = f"{self.target.base_url} refused the call (HTTP {status}: {message})"
        if env is None:
            return f"{said}: it needs an API key; name the environment variable that holds it (api_key_env)"
        if self.target.api_key() is None:
            return f"{said}: set the environment variable {env} to its API key (it is not set)"
        return f"{said}: the key in the environment variable {env} was not accepted"


def _server_message(response: httpx.Response) -> str:
    """The server's own words about a failed call: OpenAI's `error.message`, FastAPI's `detail`, or the text."""
    body = b""
    try:
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) >= ERROR_BODY_BYTES:
                break
    except httpx.HTTPError:
        pass
    text = body[:ERROR_BODY_BYTES].decode(errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300] or "(no message)"
    if isinstance(data, dict):
        error = data.get("error")
        found = error.get("message") if isinstance(error, dict) else error or data.get("detail") or data.get("message")
        if found:
            return str(found)[:300]
    return text[:300]
