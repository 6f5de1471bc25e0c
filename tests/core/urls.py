"""A URL conf for the error-page tests: the project's, plus views that fail in each way."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import path
from django.utils.decorators import sync_and_async_middleware
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.views import APIView

from synth_project.urls import handler400, handler403, handler404, handler500  # noqa: F401 - the project's
from synth_project.urls import urlpatterns as project_urlpatterns


class BoomApi(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    def get(self, request: Request) -> HttpResponse:
        raise RuntimeError("boom")


def plain_boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("boom")


async def async_boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("boom")


def _failing() -> Iterator[bytes]:
    raise RuntimeError("boom before the first byte")
    yield b""  # pragma: no cover - a generator


async def _failing_async() -> AsyncIterator[bytes]:
    raise RuntimeError("boom before the first byte")
    yield b""  # pragma: no cover - a generator


async def _chunks_async() -> AsyncIterator[bytes]:
    for chunk in (b"a", b"b", b"c"):
        yield chunk


def stream_boom(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(_failing())


def stream_ok(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(iter([b"a", b"b", b"c"]))


async def stream_boom_async(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(_failing_async())


async def stream_ok_async(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(_chunks_async())


@sync_and_async_middleware
def exploding_middleware(get_response):  # type: ignore[no-untyped-def]
    """Raises for one path: an error outside any view (sync and async, so the stack stays async)."""

    def explode(request: HttpRequest) -> None:
        if request.path_info.endswith("/test/explode"):
            raise RuntimeError("boom in a middleware")

    if iscoroutinefunction(get_response):

        async def middleware_async(request: HttpRequest) -> HttpResponse:
            explode(request)
            return await get_response(request)

        return markcoroutinefunction(middleware_async)

    def middleware(request: HttpRequest) -> HttpResponse:
        explode(request)
        return get_response(request)

    return middleware


def sync_only_middleware(get_response):  # type: ignore[no-untyped-def]
    """Makes Django run every middleware above it (ours too) in sync mode under ASGI."""
    return lambda request: get_response(request)


urlpatterns = [
    path("api/test/boom", BoomApi.as_view()),
    path("api/test/plain-boom", plain_boom),
    path("api/test/stream-boom", stream_boom),
    path("api/test/stream-ok", stream_ok),
    path("v1/test/boom", async_boom),
    path("v1/test/stream-boom", stream_boom_async),
    path("v1/test/stream-ok", stream_ok_async),
    *project_urlpatterns,
]
