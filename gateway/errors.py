"""kvgate's own errors, in OpenAI's shape.

`{"error": {"message", "type", "param", "code"}}` — the shape vLLM and OpenAI clients expect. Replica
errors are never rewritten: they pass through with their own status and body; only errors kvgate
decides (bad input, auth, limits, overload, no replica) are built here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",  # the client did not send its whole request in time
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    502: "upstream_error",
    503: "overloaded_error",
    504: "upstream_timeout",
}


@dataclass(eq=False)
class GatewayError(Exception):
    """An error kvgate answers itself. `headers` are extra response headers (e.g. Retry-After).

    Not a frozen dataclass: Python code sets attributes on exceptions in flight (`contextlib`'s
    generator context managers set `__traceback__`, `add_note` sets `__notes__`), and a frozen one
    turns each of those into a FrozenInstanceError that hides the real error. Treat it as
    immutable anyway (`dataclasses.replace` for a variant); equality is identity, as for exceptions.
    """

    status: int
    message: str
    param: str | None = None
    code: str | int | None = None
    type: str | None = None
    headers: tuple[tuple[bytes, bytes], ...] = field(default=())

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.param, self.code, self.type)

    def sse_event(self) -> bytes:
        """The same error as one SSE event, for a stream that has already started."""
        return b"data: " + self.body() + b"\n\n"


def error_body(
    status: int,
    message: str,
    param: str | None = None,
    code: str | int | None = None,
    type_: str | None = None,
) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": type_ or _TYPES.get(status, "error"),
                "param": param,
                "code": code if code is not None else status,
            }
        }
    )


def bad_request(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param)
