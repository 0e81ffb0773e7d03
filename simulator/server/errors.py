"""vLLM's error body: `{"error": {"message", "type", "param", "code"}}` with `code` equal to the status."""

from __future__ import annotations

import orjson

_TYPES = {
    400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 503: "ServiceUnavailableError",
}


class ApiError(Exception):
    """An error a client can cause or observe; rendered in vLLM's shape, never as a traceback.

    `status` is the HTTP status (and the body's `code`); `type` defaults to vLLM's name for the status.
    """

    def __init__(self, status: int, message: str, *, type: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type if type is not None else _TYPES.get(status, "BadRequestError")
        self.param = param

    def body(self) -> bytes:
        return orjson.dumps(
            {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}
        )


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)
