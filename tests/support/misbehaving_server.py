"""An OpenAI-compatible server on 127.0.0.1 that misbehaves on purpose, one way per `mode`, for the remote client's
failure tests (tests/engine/remote/).

Modes: "ok" (streams `TOKENS` chunks with usage; serves /v1/models, /v1/models/{id} and /metrics), "stall_first"
(headers, a role chunk, then only keep-alive comments; a GET's headers and then part of its body), "stall_mid" (two
chunks, then keep-alive comments), "drop_mid" (two chunks, then the connection closed mid-body), "error_event" (two
chunks, then an `error` event), "server_error" (500 with an OpenAI error message), "unauthorized" (401 unless the
Bearer key is `KEY`), "unknown_model" (404 model_not_found for completions), "redirect" (302 to another host),
"ignores_eos" (stops after 3 tokens whatever `ignore_eos` says), "too_many" (more tokens than max_tokens), "bad_json",
"reset_once" (the first request of each path is reset before a byte is answered, the next ones are "ok"). Every stall
ends when the server stops, so no thread outlives a test.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "test-model"
KEY = "sk-test-do-not-print"
TOKENS = ["Hello", ",", " world", "!", " Bye"]
PING_S = 0.05
METRICS = """# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="test-model"} 3.0
vllm:num_requests_waiting{model_name="test-model"} 1.0
vllm:kv_cache_usage_perc{model_name="test-model",note="a } in a label"} 0.25
vllm:prefix_cache_queries_total{model_name="test-model"} 200.0
vllm:prefix_cache_hits_total{model_name="test-model"} 50.0
vllm:unknown_series 7
"""


class MisbehavingServer:
    """`with MisbehavingServer("stall_first") as server:` ... `server.base_url` is its /v1 URL."""

    def __init__(self, mode: str = "ok", metrics: str | None = METRICS):
        self.mode, self.metrics = mode, metrics
        self.requests: list[tuple[str, dict, dict]] = []  # (path, headers, body) of each request seen
        self.stopping = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="misbehaving-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> MisbehavingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def closed_port_url() -> str:
    """A /v1 URL on a port of 127.0.0.1 that nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


@contextmanager
def unanswered_connect_url() -> Iterator[str]:
    """A /v1 URL whose connects time out: a listening socket whose backlog is full, so the kernel drops new SYNs."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        fillers = []
        try:
            for _ in range(3):
                filler = socket.socket()
                fillers.append(filler)
                filler.settimeout(0.3)
                try:
                    filler.connect(address)
                except OSError:  # the backlog is full: what the next connect will meet too
                    break
            yield f"http://127.0.0.1:{address[1]}/v1"
        finally:
            for filler in fillers:
                filler.close()


def _handler(server: MisbehavingServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            self._seen({})
            if server.mode == "stall_first":  # a reply's headers, then never its body
                self.send_response(200)
                self.send_header("Content-Length", "100")
                self.end_headers()
                self.wfile.write(b'{"object": ')
                self.wfile.flush()
                server.stopping.wait()
                self.close_connection = True
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}, {"id": "other"}]})
            elif self.path == f"/v1/models/{MODEL}":
                self._json(200, {"id": MODEL, "engine": {"vocab_size": 100, "backend": "fake"}, "config": {}})
            elif self.path == "/metrics" and server.metrics is not None:
                self._send(200, server.metrics.encode(), "text/plain; version=0.0.4")
            else:
                self._json(404, {"error": {"message": f"no {self.path} here", "code": "unknown_url"}})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            first = not any(path == self.path for path, _, _ in server.requests)
            self._seen(body)
            mode = server.mode
            if mode == "reset_once" and first:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True
                return
            if mode == "unauthorized" and self.headers.get("Authorization") != f"Bearer {KEY}":
                return self._json(401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}})
            if mode == "server_error":
                return self._json(500, {"error": {"message": "CUDA out of memory", "type": "internal_error"}})
            if mode == "unknown_model":
                return self._json(404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                  "code": "model_not_found"}})
            if mode == "redirect":
                self.send_response(302)
                self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._stream(body, mode)

        def _stream(self, body: dict, mode: str) -> None:
            chat = "messages" in body
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if chat:
                self._event({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
            if mode == "stall_first":
                return self._stall()
            if mode == "bad_json":
                return self._chunk(b"data: {not json\n\n")
            count = {"ignores_eos": 3, "too_many": body["max_tokens"] + 2}.get(mode, min(body["max_tokens"], 5))
            for index in range(count):
                piece = TOKENS[index % len(TOKENS)]
                self._event({"choices": [{"index": 0, "finish_reason": None,
                                          **({"delta": {"content": piece}} if chat else {"text": piece})}]})
                if index == 1 and mode == "stall_mid":
                    return self._stall()
                if index == 1 and mode == "error_event":
                    self._event({"error": {"message": "the engine failed this request", "code": 500}})
                    self.wfile.write(b"0\r\n\r\n")
                    return
                if index == 1 and mode == "drop_mid":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
            finish = "stop" if mode == "ignores_eos" or count < body["max_tokens"] else "length"
            self._event({"choices": [{"index": 0, "finish_reason": finish,
                                      **({"delta": {}} if chat else {"text": ""})}]})
            usage = {"prompt_tokens": 7, "completion_tokens": count, "total_tokens": 7 + count,
                     "prompt_tokens_details": {"cached_tokens": 4}}
            self._event({"choices": [], "usage": usage})
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")

        def _stall(self) -> None:
            """Keep-alive comments only (so a per-read timeout alone would never fire), until the server stops."""
            while not server.stopping.wait(PING_S):
                try:
                    self._chunk(b": keep-alive\n\n")
                except OSError:  # the client has gone
                    break
            self.close_connection = True

        def _event(self, event: dict) -> None:
            self._chunk(f"data: {json.dumps(event)}\n\n".encode())

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _json(self, status: int, payload: dict) -> None:
            self._send(status, json.dumps(payload).encode(), "application/json")

        def _send(self, status: int, data: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _seen(self, body: dict) -> None:
            server.requests.append((self.path, dict(self.headers), body))

    return Handler
