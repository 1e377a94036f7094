"""CorralError: an error answer of the API, or no answer at all."""

from __future__ import annotations

import json

from .types import FieldError


class CorralError(Exception):
    """An error answer of a Corral server.

    status is the HTTP status (0 when no server answered), code the class
    of the error as the server names it ("not_found", "invalid_argument",
    "failed_precondition", ...), message what a person should read, fields
    the request's fields at fault and request_id the id the server logged
    the request under.
    """

    def __init__(self, status: int, code: str, message: str, *, fields: list[FieldError] | None = None,
                 request_id: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields or []
        self.request_id = request_id

    @classmethod
    def from_answer(cls, status: int, body: bytes) -> CorralError:
        """The error of an answer with status and body: the API's error body,
        or (from something in front of the server) the body as text."""
        try:
            eb = json.loads(body)
            if isinstance(eb, dict) and isinstance(eb.get("error"), str):
                return cls(status, eb.get("code") or "unknown", eb["error"], fields=eb.get("fields") or [],
                           request_id=eb.get("request_id", ""))
        except ValueError:
            pass
        return cls(status, "unknown", body.decode("utf-8", "replace").strip() or f"HTTP {status}")

    def __str__(self) -> str:
        return f"{self.message} (HTTP {self.status} {self.code})" if self.status else self.message

    def __repr__(self) -> str:
        return f"CorralError(status={self.status!r}, code={self.code!r}, message={self.message!r})"
