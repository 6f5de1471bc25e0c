"""One error shape for the control API: {"error": {"type", "message", "field"}}."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response


class ServiceError(Exception):
    """Raised by services; the API layer maps it to a status and the error shape."""

    status_code: int = status.HTTP_400_BAD_REQUEST
    error_type = "invalid_request"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class ValidationFailed(ServiceError):
    pass


class NotFound(ServiceError):
    status_code = status.HTTP_404_NOT_FOUND
    error_type = "not_found"


class Conflict(ServiceError):
    status_code = status.HTTP_409_CONFLICT
    error_type = "conflict"


class Forbidden(ServiceError):
    status_code = status.HTTP_403_FORBIDDEN
    error_type = "permission_denied"


class StaleLease(ServiceError):
    """A write under a lease that is no longer the active one (fencing)."""

    status_code = status.HTTP_409_CONFLICT
    error_type = "stale_lease"


_TYPES = {
    400: "invalid_request",
    401: "authentication_failed",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
}


def error_type_for_status(status_code: int) -> str:
    return _TYPES.get(status_code, "server_error" if status_code >= 500 else "error")


def printable(text: str) -> str:
    """``text`` as UTF-8 can carry it: a lone surrogate (from a file name, say) becomes "\\udcff"."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(*, error_type: str, message: str, field: str | None = None) -> dict[str, Any]:
    # A message may quote the input; an unencodable one would turn this 4xx into a 500.
    return {"error": {"type": error_type, "message": printable(message), "field": field and printable(field)}}


def _first_field_error(detail: Any, prefix: str = "") -> tuple[str | None, str]:
    """The first (field path, message) of a DRF ValidationError detail tree."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if key == "non_field_errors":
                path = prefix
            field, message = _first_field_error(value, path)
            return field or None, message
    if isinstance(detail, list) and detail:
        for i, item in enumerate(detail):
            if item:
                sub = f"{prefix}[{i}]" if isinstance(item, (dict, list)) else prefix
                return _first_field_error(item, sub)
    return (prefix or None), str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    # Imported here: rest_framework.views loads the parsers named in settings, which use this module.
    from rest_framework.views import exception_handler as drf_exception_handler

    if isinstance(exc, ServiceError):
        return Response(
            error_body(error_type=exc.error_type, message=exc.message, field=exc.field),
            status=exc.status_code,
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        field, message = _first_field_error(exc.detail)
        response.data = error_body(
            error_type="invalid_request",
            message=f"{field}: {message}" if field else message,
            field=field,
        )
    else:
        detail = getattr(exc, "detail", str(exc))
        response.data = error_body(error_type=error_type_for_status(response.status_code), message=str(detail))
    return response
