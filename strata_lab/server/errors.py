"""Errors the HTTP layer turns into JSON, and the two dialects' error shapes.

Every client mistake is a `RequestError` naming the offending field; one handler renders it as OpenAI- or
Anthropic-shaped JSON depending on the route.

>>> err = RequestError("n_predict", "must be an integer")
>>> openai_error(err)["error"]["param"]
'n_predict'
>>> anthropic_error(err)["error"]["type"]
'invalid_request_error'
"""
from __future__ import annotations

__all__ = ["RequestError", "openai_error", "anthropic_error", "error_body"]

# HTTP status -> Anthropic error type (https://docs.anthropic.com/en/api/errors)
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
                    415: "invalid_request_error", 422: "invalid_request_error", 500: "api_error",
                    503: "overloaded_error"}
_OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 500: "server_error",
                 503: "server_error"}


class RequestError(ValueError):
    """A request the server will not run; `field` names the JSON field at fault (dotted path)."""

    def __init__(self, field: str | None, message: str, *, code: str = "invalid_value", status: int = 400):
        # messages quote client text; a lone surrogate there would make the error itself unencodable
        field, message = _printable(field), _printable(message)
        self.field = field
        self.message = f"{field}: {message}" if field else message
        self.code = code
        self.status = status
        super().__init__(self.message)

    def __reduce__(self):
        """Pickled as its fields (a CPU worker process sends it back to the server: cpu.py)."""
        return (_restore, (type(self), self.args, dict(self.__dict__)))


def _restore(cls, args, state):
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


def _printable(text: str | None) -> str | None:
    """`text` with anything UTF-8 cannot carry (lone surrogates) written as a backslash escape."""
    if text is None:
        return None
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def openai_error(err: RequestError) -> dict:
    return {"error": {"message": err.message, "type": _OPENAI_TYPES.get(err.status, "invalid_request_error"),
                      "param": err.field, "code": err.code}}


def anthropic_error(err: RequestError) -> dict:
    # Anthropic's shape has no `param`; the field is in the message, and we add it as an extra key.
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(err.status, "invalid_request_error"),
                                       "message": err.message, "param": err.field, "code": err.code}}


def error_body(err: RequestError, path: str) -> dict:
    """The error JSON for a request to `path` (Anthropic routes get Anthropic's shape)."""
    return anthropic_error(err) if path.startswith("/v1/messages") else openai_error(err)
