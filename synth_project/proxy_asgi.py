"""The model proxy's ASGI application: the model API under /v1 and a health path, nothing else.

    uvicorn synth_project.proxy_asgi:application --uds $SYNTH_PROXY_SOCKET

Sandboxes reach this process through the model bridge and interactive sessions through its TCP
port; neither may reach the admin, the control API or its docs. So the request's path is
checked on the ASGI scope before Django sees it: ``/v1/...`` (the Anthropic Messages API and
anything the proxy serves under /v1 later) and ``/healthz`` pass; everything else, including
any path a router could read another way (empty or dot segments, backslashes, control
characters: ``//admin/``, ``/v1/../admin/``, their percent-encodings, which the server decodes
before the check), is answered 404 in Anthropic's error shape. The check reads the same
decoded path Django routes on, and Django then resolves with a URLconf that holds only those
paths (synth_project.proxy_urls), so a path that passed cannot resolve to another view. The
Host header takes part in neither. Websocket connections are refused.

Logs stay bounded when a sandbox floods the proxy with bad connections: repeated records of
uvicorn's error log (invalid requests, rejected websockets, exceptions), of Django and the
proxy (the root handlers) and error lines of the access log are folded into counts
(synth_common.logfold). Importing this module sets that up for the process.

synth_project.asgi:application stays the whole application, for other uses.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import django
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")
django.setup(set_prefix=False)

from apps.proxy.errors import error_payload, new_request_id  # noqa: E402 - needs the app registry
from synth_common.logfold import ErrorResponseFolder, RepeatFolder  # noqa: E402

MODEL_PREFIX = "/v1/"
HEALTH_PATH = "/healthz"
PROXY_URLCONF = "synth_project.proxy_urls"
_PATH_ECHO_MAX = 200


def path_is_model_api(*, path: str) -> bool:
    """True for the paths this process serves: /healthz and /v1/<segments> with no empty,
    "." or ".." segment, no backslash and no control character."""
    if path == HEALTH_PATH:
        return True
    if not path.startswith(MODEL_PREFIX) or "\\" in path:
        return False
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        return False
    segments = path[len(MODEL_PREFIX) :].split("/")
    return all(s not in ("", ".", "..") for s in segments)


class ProxyHandler(ASGIHandler):
    """Django's ASGI handler, resolving every request with the proxy's URLconf."""

    def create_request(self, scope: dict[str, Any], body_file: Any) -> tuple[Any, Any]:
        request, error = super().create_request(scope, body_file)
        if request is not None:
            request.urlconf = PROXY_URLCONF
        return request, error


_django = ProxyHandler()


def _fold_repeated_logs() -> None:
    # On uvicorn's loggers themselves (uvicorn configures its handlers after importing the
    # application when it is given one by object) and on the root's handlers (Django's).
    folder = RepeatFolder()
    logging.getLogger("uvicorn.error").addFilter(folder)
    logging.getLogger("uvicorn.access").addFilter(ErrorResponseFolder())
    for handler in logging.getLogger().handlers:
        handler.addFilter(folder)


_fold_repeated_logs()


def _django_path(scope: dict[str, Any]) -> str:
    """The path Django routes on (ASGIRequest's path_info: the scope path without root_path)."""
    return str(scope.get("path") or "").removeprefix(str(scope.get("root_path") or ""))


async def _not_found(scope: dict[str, Any], send: Any) -> None:
    request_id = new_request_id()
    message = f"{scope.get('method', 'GET')} {str(scope.get('path') or '')[:_PATH_ECHO_MAX]} does not exist"
    body = json.dumps(error_payload(error_type="not_found_error", message=message, request_id=request_id)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"request-id", request_id.encode()),
    ]
    await send({"type": "http.response.start", "status": 404, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http":
        if path_is_model_api(path=_django_path(scope)):
            await _django(scope, receive, send)
        else:
            await _not_found(scope, send)
    elif scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
    elif scope["type"] == "lifespan":
        await _lifespan(receive, send)
