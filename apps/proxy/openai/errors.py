"""Refusals and in-stream errors in OpenAI's shape.

Body: ``{"error": {"message": m, "type": t, "param": p, "code": c}}`` with ``x-request-id``
(what the openai SDK reads) and ``request-id`` headers. The status decides which exception
the SDKs raise; the wording and codes are OpenAI's where clients match on them: OpenAI-
protocol harnesses detect a context overflow by ``code: context_length_exceeded`` (and the
"maximum context length" wording) and compact or stop, and a missing model is "The model
`X` does not exist or you do not have access to it." (code model_not_found).

| ProxyError (Anthropic status)  | status | type                  | code                    |
|--------------------------------|--------|-----------------------|-------------------------|
| InvalidRequest (400)           | 400    | invalid_request_error | null (param: the field) |
| PromptTooLong (400)            | 400    | invalid_request_error | context_length_exceeded |
| AuthenticationFailed (401)     | 401    | invalid_request_error | invalid_api_key         |
| PermissionDenied (403)         | 403    | invalid_request_error | permission_denied       |
| ModelNotFound (404)            | 404    | invalid_request_error | model_not_found         |
| NotFound (404)                 | 404    | invalid_request_error | null                    |
| MethodNotAllowed (405)         | 405    | invalid_request_error | method_not_allowed      |
| RequestTooLarge (413)          | 413    | invalid_request_error | request_too_large       |
| RateLimited (429)              | 429    | requests              | rate_limit_exceeded     |
| ApiError (500)                 | 500    | server_error          | null                    |
| Overloaded (529)               | 503    | server_error          | overloaded (retry-after)|

529 is Anthropic's own status; OpenAI's clients know 503 (and retry it, honouring retry-after).
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpResponse

from apps.proxy.errors import (
    ApiError,
    AuthenticationFailed,
    ModelNotFound,
    NotFound,
    Overloaded,
    PermissionDenied,
    PromptTooLong,
    ProxyError,
    RateLimited,
    RequestTooLarge,
)

OVERLOADED_STATUS = 503


def _shape(exc: ProxyError) -> tuple[int, str, str | None, str | None, str]:
    """(status, type, param, code, message) of `exc` in OpenAI's terms."""
    if isinstance(exc, PromptTooLong):
        message = (
            f"This model's maximum context length is {exc.maximum} tokens. However, your messages resulted in "
            f"{exc.tokens} tokens. Please reduce the length of the messages."
        )
        return 400, "invalid_request_error", "messages", "context_length_exceeded", message
    if isinstance(exc, ModelNotFound):
        message = f"The model `{exc.model}` does not exist or you do not have access to it."
        return 404, "invalid_request_error", None, "model_not_found", message
    if isinstance(exc, Overloaded):
        return OVERLOADED_STATUS, "server_error", None, "overloaded", exc.message
    if isinstance(exc, RateLimited):
        return 429, "requests", None, "rate_limit_exceeded", exc.message
    if isinstance(exc, ApiError) or exc.status >= 500:
        return exc.status, "server_error", None, None, exc.message
    code = {
        AuthenticationFailed: "invalid_api_key",
        PermissionDenied: "permission_denied",
        RequestTooLarge: "request_too_large",
    }.get(type(exc))
    if code is None and exc.status == 405:
        code = "method_not_allowed"
    if isinstance(exc, NotFound):
        code = None
    return exc.status, "invalid_request_error", exc.param, code, exc.message


def error_object(exc: ProxyError) -> dict[str, Any]:
    """The `error` object of OpenAI's error body (also what an in-stream error carries)."""
    _, error_type, param, code, message = _shape(exc)
    # A message may quote the input; one UTF-8 cannot encode would turn the answer into a 500.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"message": message, "type": error_type, "param": param, "code": code}


def error_status(exc: ProxyError) -> int:
    return _shape(exc)[0]


def error_response(exc: ProxyError, *, request_id: str) -> HttpResponse:
    response = HttpResponse(
        json.dumps({"error": error_object(exc)}, ensure_ascii=False),
        status=error_status(exc),
        content_type="application/json",
    )
    response["request-id"] = request_id
    response["x-request-id"] = request_id
    for name, value in exc.headers.items():
        response[name] = value
    if isinstance(exc, Overloaded) and "retry-after" not in exc.headers:
        response["retry-after"] = "1"
    return response


def url_not_found(*, method: str, path: str) -> NotFound:
    """OpenAI's answer to a path it does not serve."""
    return NotFound(f"Invalid URL ({method} {path[:200]})")
