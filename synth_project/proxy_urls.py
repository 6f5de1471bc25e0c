"""The URLconf of the model proxy process (synth_project.proxy_asgi): the model API and health only.

Errors that escape a view are answered in Anthropic's shape, never with Django's HTML pages.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import include, path

from apps.proxy.errors import ApiError, NotFound, error_response, new_request_id
from apps.proxy.views import health_view

urlpatterns = [
    path("healthz", health_view, name="healthz"),
    path("v1/", include("apps.proxy.urls")),
]


def not_found(request: HttpRequest, exception: Any = None) -> HttpResponse:
    return error_response(
        NotFound(f"{request.method} {request.path[:200]} does not exist"), request_id=new_request_id()
    )


def server_error(request: HttpRequest) -> HttpResponse:
    return error_response(ApiError("Internal server error"), request_id=new_request_id())


handler404 = not_found
handler500 = server_error
