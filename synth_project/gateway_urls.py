"""The gateway's URLconf (synth_project.wsgi): the control API, the admin, docs and health.

The gateway samples no model: a sampler call in a WSGI thread held that thread for the whole
generation, queued behind any other on the same model, and went on after its client had left.
The model API is served by proxy processes (synth_project.proxy_asgi, on a trials host's socket
and on a TCP listener for interactive sessions), so a /v1 request here is answered, in
Anthropic's shape, with the proxy's address instead.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt

from apps.proxy.errors import NotFound, error_response, new_request_id
from synth_project.urls import gateway_urlpatterns, handler400, handler403, handler404, handler500

__all__ = ["handler400", "handler403", "handler404", "handler500", "urlpatterns"]


@csrf_exempt
def model_api_elsewhere(request: HttpRequest, rest: str = "") -> HttpResponse:
    proxy = settings.SYNTH_PROXY_PUBLIC_URL
    message = (
        f"{request.method} {request.path[:200]}: the model API is not served by the gateway; "
        f"use the model proxy at {proxy}/v1 (ANTHROPIC_BASE_URL={proxy})"
    )
    return error_response(NotFound(message), request_id=new_request_id())


urlpatterns = [*gateway_urlpatterns, re_path(r"^v1(?P<rest>/.*)?$", model_api_elsewhere, name="v1-elsewhere")]
