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

import asyncio
import contextlib
import gc
import json
import logging
import os
from typing import Any

import django
from django.core.handlers.asgi import ASGIHandler, get_script_prefix

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")
# This process is the proxy: its settings keep its database threads' connections
# (SYNTH_PROXY_DB_CONN_MAX_AGE). Without effect when the settings were loaded before (tests).
os.environ.setdefault("SYNTH_PROXY_PROCESS", "true")
django.setup(set_prefix=False)

from django.conf import settings  # noqa: E402
from django.core import signals  # noqa: E402
from django.core.exceptions import ImproperlyConfigured, RequestAborted  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402
from django.urls import set_script_prefix  # noqa: E402
from django.utils.module_loading import import_string  # noqa: E402

from apps.proxy.db import db_phase  # noqa: E402
from apps.proxy.errors import error_payload, new_request_id  # noqa: E402 - needs the app registry
from apps.proxy.exchange import lookups_tend  # noqa: E402
from apps.proxy.warmup import proxy_warm  # noqa: E402
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


# The proxy's middleware, instead of settings.MIDDLEWARE: all async, so a request crosses
# no thread on its way to the view and back. The whole app's stack (sessions, CSRF, auth,
# messages: the views under /v1 use none of them) is sync-only middleware, each costing two
# thread hops per request in an async handler; proxy_headers sets the headers it set.
PROXY_MIDDLEWARE = (
    "synth_project.middleware.json_errors",
    "synth_project.middleware.strict_input",
    "synth_project.middleware.proxy_headers",
)


class ProxyHandler(ASGIHandler):
    """Django's ASGI handler with the proxy's async middleware, resolving every request with
    the proxy's URLconf."""

    def load_middleware(self, is_async: bool = False) -> None:
        """Django's load_middleware for PROXY_MIDDLEWARE, which must be async-capable
        function middleware (no view, template or exception hooks)."""
        if not is_async:
            raise ImproperlyConfigured("the proxy's handler is async only")
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        # Django's own async request path (the view and its exception handling); not in the stubs.
        handler = convert_exception_to_response(self._get_response_async)  # type: ignore[attr-defined]
        for path in reversed(PROXY_MIDDLEWARE):
            middleware = import_string(path)
            if not getattr(middleware, "async_capable", False):
                raise ImproperlyConfigured(f"{path} is not async-capable: the proxy's stack must stay async")
            handler = convert_exception_to_response(middleware(handler))
        self._middleware_chain = handler

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # Django's handler runs each request in its own ThreadSensitiveContext, which makes a
        # thread for the request's first thread-sensitive call (here: only the request
        # signals and the response's close; the database phases have their own threads,
        # apps.proxy.db). Without it those few short calls share Django's one sync thread.
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        await self.handle(scope, receive, send)

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django's ASGIHandler.handle (5.2) without its task per request (see below) and its
        two thread hops per request: the request_started signal and the response's close,
        each a sync_to_async call (about 10% of the proxy's GIL time at 200 sessions, with
        asgiref's per-call wrapper).

        Their receivers (reset_queries, close_old_connections, close_caches, reset_urlconf)
        tend the connections and settings of the thread that runs a request's synchronous
        code. Here that code runs on the database phases' threads (apps.proxy.db), which give
        their connection back after each phase; the event loop's thread holds none. So the
        start signal is not sent, and a response is closed on the loop (its close still sends
        request_finished, cheap with nothing to close there), unless its close blocks
        (`close_blocks`: the JSON answer that records its delivery), which runs as a
        database phase."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            await _response_close(error_response)
            return

        # The request is served in this task, not in a task of its own as Django does: a new
        # task first runs one turn of the loop later, behind every callback ready by then, and
        # when a fleet's sessions open together that turn is long (the view began p50 27-44 ms
        # after the request reached the application, with 100 requests arriving at a process).
        # The disconnect listener is the task of its own: on a disconnect it cancels this one,
        # as Django cancels its request task, and the view may handle that cancellation.
        serving = asyncio.current_task()
        assert serving is not None
        ended: list[BaseException] = []  # what the listener saw: RequestAborted, or a bad message

        async def listen() -> None:
            try:
                await self.listen_for_disconnect(receive)
            except (RequestAborted, AssertionError) as exc:
                ended.append(exc)
                serving.cancel()

        listener = asyncio.create_task(listen())
        response = None
        try:
            response = await self.run_get_response(request)
            await self.send_response(response, send)
        except asyncio.CancelledError:
            if not ended:
                raise  # not the listener's: the server's (shutting down)
            serving.uncancel()
        finally:
            listener.cancel()
        if ended and not isinstance(ended[0], RequestAborted):
            body_file.close()
            raise ended[0]
        if response is None:  # the client disconnected before the response was made
            signals.request_finished.send(sender=self.__class__)
        else:
            await _response_close(response)
        body_file.close()

    def create_request(self, scope: dict[str, Any], body_file: Any) -> tuple[Any, Any]:
        request, error = super().create_request(scope, body_file)
        if request is not None:
            request.urlconf = PROXY_URLCONF
        return request, error


async def _response_close(response: Any) -> None:
    if getattr(response, "close_blocks", False):
        await db_phase(response.close)()
    else:
        response.close()


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


def _gc_settle() -> None:
    """Once warm, before the first call: freeze what start-up loaded (Django, the adapters,
    the tokenizers: over 100,000 objects that live as long as the process) out of the garbage
    collector's scans, and collect the young generation less often
    (SYNTH_PROXY_GC_YOUNG_THRESHOLD). Measured at 200 sessions: the collector's share fell
    from about 1 ms of CPU per call (several young collections per call, and full ones that
    walked every start-up object) to well under 0.1 ms. Cycles are still collected."""
    gc.collect()
    gc.freeze()
    young = settings.SYNTH_PROXY_GC_YOUNG_THRESHOLD
    if young:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young, middle, old)


async def _lifespan(receive: Any, send: Any) -> None:
    tending: asyncio.Task[None] | None = None
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            # Before the server accepts a connection (apps.proxy.warmup says why); off the
            # loop, which has nothing else to run yet but the server's own start.
            families = await asyncio.to_thread(proxy_warm, urlconf=PROXY_URLCONF)
            logging.getLogger(__name__).info("proxy warmed: adapters %s", ", ".join(families) or "none")
            _gc_settle()
            # Before the first call: the credentials of attempts starting now are cached ahead.
            tending = asyncio.create_task(lookups_tend())
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if tending is not None:
                tending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await tending
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
