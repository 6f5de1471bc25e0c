"""Every error answers JSON in its surface's shape, never an HTML page: with DEBUG on and off,
from a view, a middleware, the URL resolver or a stream failing before its first byte."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.core.urls")]

INTERNAL = {"error": {"type": "server_error", "message": "Internal server error", "field": None}}


@pytest.fixture(params=[False, True], ids=["debug-off", "debug-on"])
def debug(request, settings) -> bool:
    settings.DEBUG = request.param
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.core.urls.exploding_middleware"]
    return request.param


def get(path: str, **extra):
    response = Client(raise_request_exception=False).get(path, **extra)
    assert response["Content-Type"] == "application/json", (response["Content-Type"], response.content[:300])
    return response


def get_async(path: str):
    async def run():
        response = await AsyncClient(raise_request_exception=False).get(path)
        if response.streaming:
            return response, b"".join([chunk async for chunk in response.streaming_content])
        return response, response.content

    return async_to_sync(run)()


@pytest.mark.parametrize(
    "path", ["/api/test/boom", "/api/test/plain-boom", "/api/test/stream-boom", "/api/test/explode"]
)
def test_a_server_error_is_json(debug, path):
    response = get(path)
    assert response.status_code == 500
    assert response.json() == INTERNAL


def test_an_unknown_path_is_a_json_404(debug):
    for path in ("/api/nowhere", "/nowhere", "/api"):
        response = get(path)
        assert response.status_code == 404
        assert response.json()["error"] == {"type": "not_found", "message": f"GET {path} does not exist", "field": None}


def test_a_suspicious_request_is_a_json_400(debug, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 5
    response = get("/api/runs?" + "&".join(f"a={i}" for i in range(10)))
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request"


@pytest.mark.parametrize("path", ["/v1/test/boom", "/v1/test/stream-boom", "/v1/test/explode"])
def test_a_proxy_server_error_is_anthropic_shaped(debug, path):
    response, content = get_async(path)
    assert response.status_code == 500 and response["Content-Type"] == "application/json"
    body = json.loads(content)
    assert body["type"] == "error" and body["error"] == {"type": "api_error", "message": "Internal server error"}
    assert response["request-id"].startswith("req_") and body["request_id"] == response["request-id"]


def test_a_proxy_stream_failing_early_is_json_in_a_sync_middleware_stack_too(debug, settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.core.urls.sync_only_middleware"]
    response, content = get_async("/v1/test/stream-boom")
    assert response.status_code == 500 and json.loads(content)["error"]["type"] == "api_error"
    response, content = get_async("/v1/test/stream-ok")
    assert response.status_code == 200 and content == b"abc"


def test_a_stream_that_starts_is_delivered_whole(debug):
    response = Client(raise_request_exception=False).get("/api/test/stream-ok")
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"abc"
    response, content = get_async("/v1/test/stream-ok")
    assert response.status_code == 200 and content == b"abc"


def test_the_admin_keeps_its_html(debug):
    response = Client(raise_request_exception=False).get("/admin/login/")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/html")
