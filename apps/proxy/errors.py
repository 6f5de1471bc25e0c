"""Errors of the /v1 model proxy, in Anthropic's shape.

Body: ``{"type": "error", "error": {"type": <t>, "message": <m>}, "request_id": "req_..."}``
and a ``request-id`` header. Claude Code's retry and compaction logic matches on the
type and the wording (e.g. "prompt is too long: N tokens > M maximum" triggers
auto-compaction), so the wording below is deliberate. The control API (/api) keeps its
own shape (apps.core.errors); nothing here is used there.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpResponse

from apps.core.ids import new_id


class ProxyError(Exception):
    status = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        # The request field at fault (OpenAI's error `param`); Anthropic's shape has none.
        self.param = param

    @classmethod
    def for_status(cls, status: int, message: str) -> ProxyError:
        """An error of `status` (the class of that status where there is one)."""
        for sub in (InvalidRequest, AuthenticationFailed, PermissionDenied, NotFound, RequestTooLarge, RateLimited):
            if sub.status == status:
                return sub(message)
        base = Overloaded if status == Overloaded.status else ApiError if status >= 500 else cls
        if base.status == status:
            return base(message)
        # A status without a class of its own: its class is made here, as the others are declared.
        return type(f"{base.__name__}{status}", (base,), {"status": status})(message)


class InvalidRequest(ProxyError):
    status = 400
    error_type = "invalid_request_error"


class AuthenticationFailed(ProxyError):
    status = 401
    error_type = "authentication_error"


class PermissionDenied(ProxyError):
    status = 403
    error_type = "permission_error"


class NotFound(ProxyError):
    status = 404
    error_type = "not_found_error"


class ModelNotFound(NotFound):
    """No route serves the requested model (OpenAI answers it with its own wording)."""

    def __init__(self, message: str, *, model: str) -> None:
        super().__init__(message, param="model")
        self.model = model


class RequestTooLarge(ProxyError):
    status = 413
    error_type = "request_too_large"


class RateLimited(ProxyError):
    status = 429
    error_type = "rate_limit_error"


class ApiError(ProxyError):
    status = 500
    error_type = "api_error"


class Overloaded(ProxyError):
    status = 529
    error_type = "overloaded_error"


class PromptTooLong(InvalidRequest):
    """Anthropic's wording, which Claude Code recognizes and answers by compacting."""

    def __init__(self, *, tokens: int, maximum: int) -> None:
        super().__init__(f"prompt is too long: {tokens} tokens > {maximum} maximum")
        self.tokens = tokens
        self.maximum = maximum


def new_request_id() -> str:
    return new_id("req")


_TYPES_BY_STATUS = {
    cls.status: cls.error_type
    for cls in (AuthenticationFailed, PermissionDenied, NotFound, RequestTooLarge, RateLimited, Overloaded)
}


def error_type_for_status(status: int) -> str:
    """The Anthropic error type of an HTTP status (a 4xx not listed is a request error)."""
    return _TYPES_BY_STATUS.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_payload(*, error_type: str, message: str, request_id: str | None = None) -> dict[str, Any]:
    # A message may quote the input; one UTF-8 cannot encode would turn the answer into a 500.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    body: dict[str, Any] = {"type": "error", "error": {"type": error_type, "message": message}}
    if request_id:
        body["request_id"] = request_id
    return body


def error_response(exc: ProxyError, *, request_id: str) -> HttpResponse:
    response = HttpResponse(
        json.dumps(error_payload(error_type=exc.error_type, message=exc.message, request_id=request_id)),
        status=exc.status,
        content_type="application/json",
    )
    response["request-id"] = request_id
    for name, value in exc.headers.items():
        response[name] = value
    return response
