"""The outermost middleware: strict request text, and JSON for every error.

``strict_input``: a NUL or a lone surrogate in the path, the query string or a header is
refused with 400 before anything reads it (query values and headers such as
Idempotency-Key reach the database, which cannot store U+0000).

``json_errors``: whatever answers an error without JSON (Django's DEBUG pages, a
middleware's or the URL resolver's exception, a CSRF refusal) is rewritten to the JSON
shape of its surface (synth_project.errors); the admin keeps its HTML. A streaming
response's first chunk is produced here, so that its generator failing before the first
byte is a JSON 500 rather than a broken stream or the server's own HTML page.

Both work for WSGI (the gateway) and ASGI (the proxy's async views) without a thread hop.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.core.exceptions import SuspiciousOperation
from django.http import FileResponse, HttpRequest, HttpResponse, StreamingHttpResponse
from django.utils.decorators import sync_and_async_middleware

from apps.core.inputs import text_problem
from synth_project.errors import is_admin_path, json_error_response

logger = logging.getLogger(__name__)

GetResponse = Callable[[HttpRequest], Any]


def _request_text_problem(request: HttpRequest) -> tuple[str, str | None] | None:
    """(message, field) for the first bad text of the request, or None."""
    try:
        query = request.GET.lists()
    except SuspiciousOperation as exc:  # too many fields: Django's own refusal
        return str(exc), None
    problem = text_problem(request.path_info)
    if problem:
        return f"the path {problem}", None
    for key, values in query:
        if text_problem(key):
            return f"a query parameter name {text_problem(key)}", None
        problem = next((p for p in map(text_problem, values) if p), None)
        if problem:
            return f"the query parameter {key[:40]!r} {problem}", key
    for name, value in request.META.items():
        if (name.startswith("HTTP_") or name in ("CONTENT_TYPE", "CONTENT_LENGTH")) and isinstance(value, str):
            problem = text_problem(value)
            if problem:
                header = name.removeprefix("HTTP_").replace("_", "-").title()
                return f"the header {header} {problem}", header
    return None


@sync_and_async_middleware
def strict_input(get_response: GetResponse) -> GetResponse:
    def refusal(request: HttpRequest) -> HttpResponse | None:
        problem = _request_text_problem(request)
        if problem is None:
            return None
        return json_error_response(request, status=400, message=problem[0], field=problem[1])

    if iscoroutinefunction(get_response):

        async def middleware_async(request: HttpRequest) -> HttpResponse:
            return refusal(request) or await get_response(request)

        return markcoroutinefunction(middleware_async)

    def middleware(request: HttpRequest) -> HttpResponse:
        return refusal(request) or get_response(request)

    return middleware


def _needs_rewrite(request: HttpRequest, response: HttpResponse) -> bool:
    if response.status_code < 400 or is_admin_path(request.path_info):
        return False
    return not response.get("Content-Type", "").startswith("application/json")


def _prefetchable(request: HttpRequest, response: HttpResponse) -> bool:
    # A file is opened by its view (failures there are the view's); its first read is not.
    return (
        isinstance(response, StreamingHttpResponse)
        and not isinstance(response, FileResponse)
        and response.status_code < 400
        and not is_admin_path(request.path_info)
    )


def _failed(request: HttpRequest, what: str) -> HttpResponse:
    logger.exception("%s of %s %s failed", what, request.method, request.path_info)
    return json_error_response(request, status=500)


def _first_chunk(request: HttpRequest, response: StreamingHttpResponse) -> HttpResponse:
    content = iter(response.streaming_content)
    try:
        first = next(content)
    except StopIteration:
        return response
    except Exception:  # noqa: BLE001 - answered as a JSON 500, and logged
        return _failed(request, "the response stream (before its first byte)")
    response.streaming_content = itertools.chain((first,), content)
    return response


async def _chained(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        yield first
        async for part in rest:
            yield part
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


async def _first_chunk_async(request: HttpRequest, response: StreamingHttpResponse) -> HttpResponse:
    content = aiter(response.streaming_content)
    try:
        first = await anext(content)
    except StopAsyncIteration:
        return response
    except Exception:  # noqa: BLE001 - answered as a JSON 500, and logged
        return _failed(request, "the response stream (before its first byte)")
    response.streaming_content = _chained(first, content)
    return response


def _finish(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    if _needs_rewrite(request, response):
        return json_error_response(request, status=response.status_code)
    if not _prefetchable(request, response):
        return response
    if response.is_async:  # a sync-only middleware below made this stack sync
        return async_to_sync(_first_chunk_async)(request, response)
    return _first_chunk(request, response)


async def _finish_async(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    if _needs_rewrite(request, response):
        return json_error_response(request, status=response.status_code)
    if not _prefetchable(request, response):
        return response
    if response.is_async:
        return await _first_chunk_async(request, response)
    # A sync generator's code must not run on the event loop.
    return await sync_to_async(_first_chunk, thread_sensitive=True)(request, response)


@sync_and_async_middleware
def json_errors(get_response: GetResponse) -> GetResponse:
    # Django turns an exception below into a response before it reaches here; one that
    # escapes anyway (an error page that fails itself) is answered here as the last resort.
    if iscoroutinefunction(get_response):

        async def middleware_async(request: HttpRequest) -> HttpResponse:
            try:
                response = await get_response(request)
            except Exception:  # noqa: BLE001
                return _failed(request, "the error handling")
            return await _finish_async(request, response)

        return markcoroutinefunction(middleware_async)

    def middleware(request: HttpRequest) -> HttpResponse:
        try:
            response = get_response(request)
        except Exception:  # noqa: BLE001
            return _failed(request, "the error handling")
        return _finish(request, response)

    return middleware


# The proxy's headers (synth_project.proxy_asgi)
# ------------------------------------------------------------------------------
# The headers Django's SecurityMiddleware, XFrameOptionsMiddleware and CommonMiddleware set on
# a /v1 response, with the settings' defaults. Those middleware are sync-only in an async stack
# (each costs two thread hops per request); the proxy's stack sets the same headers here instead.
PROXY_RESPONSE_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}


def proxy_headers(get_response: GetResponse) -> GetResponse:
    """Async only: the proxy's stack is async from end to end."""
    if not iscoroutinefunction(get_response):
        raise TypeError("proxy_headers serves an async stack only")

    async def middleware_async(request: HttpRequest) -> HttpResponse:
        response = await get_response(request)
        for name, value in PROXY_RESPONSE_HEADERS.items():
            response.headers.setdefault(name, value)
        if not response.streaming and "Content-Length" not in response:
            response.headers["Content-Length"] = str(len(response.content))
        return response

    return markcoroutinefunction(middleware_async)


proxy_headers.sync_capable = False  # type: ignore[attr-defined]
proxy_headers.async_capable = True  # type: ignore[attr-defined]
