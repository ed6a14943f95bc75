"""Errors in OpenAI's format, `{"error": {"message", "type", "param", "code"}}`, for every refusal of the `/v1` routes.

Why a module: the request checks, the admission bound and the routes all answer with the same shape, so clients
(the `openai` package among them) read every refusal alike, with `param` naming the field at fault.
"""

from __future__ import annotations

import json

from fastapi.responses import JSONResponse

from playground.shared.errors import Refused


class APIError(Exception):
    """An error answered in OpenAI's format, with its HTTP status."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code

    @classmethod
    def refused(cls, refusal: Refused, param: str | None = None) -> APIError:
        """A 400 for what the playground refused, naming its field (or `param` when the refusal names none)."""
        return cls(400, str(refusal), param=refusal.field or param)

    def response(self) -> JSONResponse:
        return _EscapedJSON({"error": {"message": str(self), "type": self.kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status)


class _EscapedJSON(JSONResponse):
    """JSON with every non-ASCII character escaped, so an error that quotes a lone surrogate a client sent is still
    sent (FastAPI's own encoding of it as UTF-8 would fail with a 500)."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")
