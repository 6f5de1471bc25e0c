"""JSON error answers for the whole project, never Django's HTML pages.

``/v1/...`` answers in Anthropic's shape (apps.proxy.errors), or OpenAI's under OpenAI's API
paths (apps.proxy.openai), everything else in the control API's (apps.core.errors). Used by the project's error handlers (handler400/403/404/500 in
urls.py, which Django calls when DEBUG is off) and by the middleware that rewrites any other
non-JSON error (DEBUG pages, errors raised in middleware; synth_project.middleware).
The admin keeps its HTML.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from apps.core.errors import error_body, error_type_for_status
from apps.proxy.errors import ProxyError, error_payload, new_request_id
from apps.proxy.errors import error_type_for_status as proxy_error_type
from apps.proxy.openai.errors import error_response as openai_error_response
from apps.proxy.openai.views import API_FAMILIES

ADMIN_PREFIX = "/admin/"


def is_proxy_path(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def is_openai_path(path: str) -> bool:
    return path.startswith("/v1/") and path[4:].split("/", 1)[0] in API_FAMILIES


def is_admin_path(path: str) -> bool:
    return path.startswith(ADMIN_PREFIX)


def _message(request: HttpRequest, status: int) -> str:
    if status == 404:
        return f"{request.method} {request.path_info} does not exist"
    if status >= 500:
        return "Internal server error"
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"


def json_error_response(
    request: HttpRequest, *, status: int, message: str | None = None, field: str | None = None
) -> HttpResponse:
    """The error answer for ``request``'s surface, in its shape (``field`` for the control API's)."""
    message = message or _message(request, status)
    if is_openai_path(request.path_info):
        request_id = new_request_id()
        return openai_error_response(ProxyError.for_status(status, message), request_id=request_id)
    if is_proxy_path(request.path_info):
        request_id = new_request_id()
        payload = error_payload(error_type=proxy_error_type(status), message=message, request_id=request_id)
        response: HttpResponse = JsonResponse(payload, status=status)
        response["request-id"] = request_id
        return response
    body = error_body(error_type=error_type_for_status(status), message=message, field=field)
    return JsonResponse(body, status=status)


def bad_request(request: HttpRequest, exception: Any = None) -> HttpResponse:
    return json_error_response(request, status=400)


def permission_denied(request: HttpRequest, exception: Any = None) -> HttpResponse:
    return json_error_response(request, status=403)


def page_not_found(request: HttpRequest, exception: Any = None) -> HttpResponse:
    return json_error_response(request, status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    return json_error_response(request, status=500)
