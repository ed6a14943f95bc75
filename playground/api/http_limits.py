"""Bounds on what one HTTP request may cost the server before any handler sees it: the size of its body and the time
its client may take to send its headers and its body.

Why: every route (Gradio's and the OpenAI ones) read a request's body whole, however large, before anything checked
it (a 50 MB JSON body was read and answered; eight at once grew the process by 0.9 GB), and a client may trickle its
bytes to hold a connection open. `BodyLimits` (ASGI middleware) reads each body here: a declared length over
`max_bytes` is refused with 413 before a byte of it is read, a body that grows past it is refused as soon as it
does, and one that does not arrive within `timeout_s` gets 408; the handler then gets the body as it arrived. The
headers are the HTTP server's to read: `bounded_protocol` is uvicorn's HTTP protocol with a timer that closes a
connection whose request line and headers do not arrive within their timeout. After a refusal the rest of the body
is discarded as it arrives for LINGER_S, then the connection is closed: closed at once, with the client still
sending, the connection was reset and the client often lost the answer.
"""

from __future__ import annotations

import json

import anyio
import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

LINGER_S = 2.0


async def _refuse(send, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": "request_too_large" if status == 413 else "request_timeout"}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _declared_length(scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimits:
    """ASGI middleware: every HTTP request's body read in full here, at most `max_bytes`, within `timeout_s`."""

    def __init__(self, app, max_bytes: int, timeout_s: float):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = (f"the request body is over this server's limit of {self.max_bytes // 2**20} MiB "
                     "(PLAYGROUND_MAX_BODY_MIB)")
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _refuse(send, 413, too_large)
            return
        chunks, size = [], 0
        with anyio.move_on_after(self.timeout_s) as deadline:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_bytes:
                    await _refuse(send, 413, too_large)
                    return
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        if deadline.cancelled_caught:
            await _refuse(send, 408, f"the request body did not arrive within {self.timeout_s:g} s "
                                     "(PLAYGROUND_BODY_TIMEOUT_S)")
            return
        body, delivered = b"".join(chunks), False

        async def replay():
            nonlocal delivered
            if delivered:
                return await receive()  # what follows the body: the client's disconnect
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def bounded_protocol(header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing any connection whose next request's headers take over `header_timeout_s`, and
    any whose refused body is still arriving LINGER_S after the refusal (uvicorn discards it meanwhile)."""

    class HeaderTimeoutProtocol(H11Protocol):
        _headers_due = None
        _linger = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._expect_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the headers are in
                self._stop_waiting()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is h11.SEND_BODY:  # answered before its body was in: a refusal
                self._linger = self._linger or self.loop.call_later(LINGER_S, self.transport.close)
            else:
                self._expect_headers()  # of the next request on this connection

        def connection_lost(self, exc) -> None:
            self._stop_waiting()
            if self._linger is not None:
                self._linger.cancel()
            super().connection_lost(exc)

        def _expect_headers(self) -> None:
            self._stop_waiting()
            self._headers_due = self.loop.call_later(header_timeout_s, self._headers_late)

        def _stop_waiting(self) -> None:
            if self._headers_due is not None:
                self._headers_due.cancel()
                self._headers_due = None

        def _headers_late(self) -> None:
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol
