"""The proxy process's ASGI application answers the model API and health, and nothing else."""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import time
from typing import Any

import pytest
from django.urls import Resolver404, resolve

from synth_project.proxy_asgi import application, path_is_model_api


async def _call(
    path: str, *, raw_path: bytes | None = None, host: bytes = b"proxy", root_path: str = "", kind: str = "http"
) -> list[dict[str, Any]]:
    scope = {
        "type": kind,
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": raw_path if raw_path is not None else path.encode(),
        "query_string": b"",
        "root_path": root_path,
        "headers": [(b"host", host)],
        "client": ("127.0.0.1", 40000),
        "server": ("proxy", 80),
    }
    sent: list[dict[str, Any]] = []
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # no disconnect: the handler stops listening when done
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await application(scope, receive, send)
    return sent


def call(path: str, **kwargs: Any) -> tuple[int, dict[bytes, bytes], Any]:
    sent = asyncio.run(_call(path, **kwargs))
    start = sent[0]
    assert start["type"] == "http.response.start"
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), json.loads(body)


def assert_anthropic_404(status: int, headers: dict[bytes, bytes], body: Any) -> None:
    assert status == 404
    assert headers[b"content-type"].startswith(b"application/json")
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert body["request_id"].startswith("req_") and headers[b"request-id"] == body["request_id"].encode()


BLOCKED = [
    "/",
    "/admin/",
    "/admin/login/",
    "/api/runs",
    "/api/docs/",
    "/api/schema/",
    "/static/admin/css/base.css",
    "//admin/",
    "//v1/models",
    "/v1",
    "/v1/",
    "/v1//models",
    "/v1/../admin/",
    "/v1/./models",
    "/v1/models/..",
    "/v1\\..\\admin/",
    "/v1/models\x00",
    "/v1/models\r\nHost: admin",
    "/V1/models",
    "/healthz/",
    "/healthz/../admin/",
]


@pytest.mark.parametrize("path", BLOCKED)
def test_other_paths_are_an_anthropic_404_before_django(path: str) -> None:
    assert not path_is_model_api(path=path)
    assert_anthropic_404(*call(path))


def test_percent_encoded_tricks_are_checked_as_decoded() -> None:
    # The server decodes the target before the application sees it; the check reads the same
    # decoded path Django would route on.
    assert_anthropic_404(*call("/v1/../admin/", raw_path=b"/v1/%2e%2e/admin/"))
    assert_anthropic_404(*call("/admin/", raw_path=b"/%61dmin/"))
    assert_anthropic_404(*call("/v1/%2e%2e/admin/", raw_path=b"/v1/%252e%252e/admin/"))  # reaches /v1's 404


def test_the_host_header_changes_nothing() -> None:
    assert_anthropic_404(*call("/admin/", host=b"admin.internal"))
    status, _headers, body = call("/v1/no-such-endpoint", host=b"admin.internal")
    assert status == 404 and "/v1/no-such-endpoint" in body["error"]["message"]


def test_model_paths_reach_the_proxy_views() -> None:
    assert path_is_model_api(path="/v1/messages") and path_is_model_api(path="/v1/models/claude-sonnet-4-5")
    assert path_is_model_api(path="/v1/models/Qwen/Qwen3-8B")  # route names may hold a slash
    status, _headers, body = call("/v1/no-such-endpoint")
    assert status == 404 and body["error"]["message"] == "GET /v1/no-such-endpoint does not exist"
    status, _headers, body = call("/v1/models")  # no credential: the proxy's own 401
    assert status == 401 and body["error"]["type"] == "authentication_error"


@pytest.mark.django_db(transaction=True)
def test_health_answers() -> None:
    status, _headers, body = call("/healthz")
    assert status == 200 and body == {"ok": True}


def test_a_root_path_is_taken_off_as_django_does() -> None:
    assert_anthropic_404(*call("/base/admin/", root_path="/base"))
    status, _headers, body = call("/base/v1/nope", root_path="/base")
    assert status == 404 and body["error"]["message"] == "GET /v1/nope does not exist"  # /v1's own 404


@pytest.fixture
def gc_restored():
    """The lifespan tunes the process's garbage collector: this test process's is put back."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_websockets_are_refused_and_lifespan_is_answered(gc_restored, settings) -> None:
    sent = asyncio.run(_call("/v1/messages", kind="websocket"))
    assert sent == [{"type": "websocket.close", "code": 1008}]

    settings.SYNTH_PROXY_GC_YOUNG_THRESHOLD = 12_345
    gc.unfreeze()
    assert asyncio.run(_lifespan()) == [{"type": "lifespan.startup.complete"}, {"type": "lifespan.shutdown.complete"}]
    # Warm, the process froze what start-up loaded and collects young objects less often.
    assert gc.get_freeze_count() > 0 and gc.get_threshold()[0] == 12_345


async def _lifespan() -> list[dict[str, Any]]:
    """What the application answers to a server's lifespan startup, then shutdown."""
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    out: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: dict[str, Any]) -> None:
        out.append(message)

    await application({"type": "lifespan"}, receive, send)
    return out


def test_the_proxy_urlconf_holds_only_the_model_api() -> None:
    for path in ["/admin/", "/api/runs", "/api/docs/", "/healthz/"]:
        with pytest.raises(Resolver404):
            resolve(path, urlconf="synth_project.proxy_urls")
    assert resolve("/v1/messages", urlconf="synth_project.proxy_urls").url_name == "v1-messages"
    assert resolve("/healthz", urlconf="synth_project.proxy_urls").url_name == "healthz"


@pytest.mark.django_db(transaction=True)  # the warm-up reads the routes from its own thread
def test_startup_loads_every_enabled_routes_adapter_before_the_first_call(
    monkeypatch, caplog, settings, tmp_path, qwen3_tokenizer
) -> None:
    from apps.proxy.adapters import registry
    from apps.proxy.models import ModelRoute

    from .conftest import TOKENIZER_DIR, make_route

    # A tokenizer directory holding only Qwen3's, and a new process: nothing loaded yet.
    shutil.copytree(TOKENIZER_DIR / "qwen3", tmp_path / "qwen3")
    settings.SYNTH_TOKENIZER_DIR = tmp_path
    monkeypatch.setattr(registry, "_adapters", {})

    make_route(name="served")
    # A family whose tokenizer is not provisioned, and one no adapter renders: logged, and
    # the process still starts (their callers get the misconfiguration on their call).
    make_route(name="unprovisioned", family="kimi-k2")
    for name, family, enabled in (("unknown", "nope", True), ("off", "glm-4.6", False)):
        ModelRoute.objects.create(
            name=name,
            family=family,
            tokenizer=family,
            context_window=10,
            max_output=5,
            sampler_backend="scripted",
            inference_enabled=enabled,
        )

    with caplog.at_level("WARNING", logger="apps.proxy.warmup"):
        assert asyncio.run(_lifespan())[0] == {"type": "lifespan.startup.complete"}
    assert set(registry._adapters) == {"qwen3"}
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "family kimi-k2 not loaded" in warned and "family nope not loaded" in warned
    assert "family glm-4.6" not in warned  # a route with inference off is not warmed


@pytest.mark.django_db(transaction=True)  # the live proxy's database phases run on their own threads
@pytest.mark.parametrize("stream", [False, True])
def test_the_proxy_handler_records_delivery_once_the_answer_is_sent(live_proxy, stream) -> None:
    """The proxy's handler closes a JSON answer, which records its delivery, in a database
    phase and a stream on the loop; either way the call is settled delivered, and a body
    that is not JSON is the client's error in Anthropic's shape."""
    import httpx

    from apps.proxy.models import Delivery, Interaction
    from tests.conftest import make_member

    from .conftest import issue, make_route

    member = make_member("team", "alice")
    make_route("qwen3-instant")
    headers = {"x-api-key": issue(member.org, "qwen3-instant"), "anthropic-version": "2023-06-01"}
    body = {
        "model": "qwen3-instant",
        "max_tokens": 16,
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with httpx.Client(base_url=live_proxy.url, timeout=60) as client:
        reply = client.post("/v1/messages", json=body, headers=headers)
        assert reply.status_code == 200
        assert ("event: message_stop" in reply.text) if stream else reply.json()["type"] == "message"
        bad = client.post("/v1/messages", content=b"{not json", headers={**headers, "content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    # The handler closes the response after its last byte: wait for that close's write.
    interaction = Interaction.objects.get(org=member.org)
    deadline = time.monotonic() + 30
    while interaction.delivery == Delivery.PENDING and time.monotonic() < deadline:
        time.sleep(0.02)
        interaction.refresh_from_db()
    assert interaction.delivery == Delivery.DELIVERED and interaction.stream is stream


def _scope(path: str = "/v1/models") -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"proxy")],
        "client": ("127.0.0.1", 40000),
        "server": ("proxy", 80),
    }


@pytest.fixture
def waiting_view(monkeypatch):
    """The handler's view replaced by one that waits until cancelled; what it saw."""
    from synth_project import proxy_asgi

    seen: dict[str, Any] = {"started": asyncio.Event()}

    async def view(self: Any, request: Any) -> Any:
        seen["task"] = asyncio.current_task()
        seen["started"].set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise
        raise AssertionError("unreachable")

    monkeypatch.setattr(proxy_asgi.ProxyHandler, "run_get_response", view)
    return seen


def test_a_disconnect_cancels_the_view_which_runs_in_the_requests_own_task(waiting_view) -> None:
    """The view runs in the task the server called the application in (no task of its own,
    a turn of the loop later); a client that disconnects cancels it there, and the handler
    ends the request quietly, as Django's does."""
    from django.core import signals

    finished: list[Any] = []

    def on_finished(**kwargs: Any) -> None:
        finished.append(kwargs["sender"])

    async def main() -> tuple[Any, list[dict[str, Any]]]:
        messages = [{"type": "http.request", "body": b"", "more_body": False}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await waiting_view["started"].wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await application(_scope(), receive, send)
        return asyncio.current_task(), sent

    signals.request_finished.connect(on_finished)
    try:
        task, sent = asyncio.run(main())
    finally:
        signals.request_finished.disconnect(on_finished)
    assert waiting_view["task"] is task and waiting_view["cancelled"] is True
    assert sent == [] and len(finished) == 1


def test_a_cancellation_that_is_not_a_disconnect_goes_on_to_the_server(waiting_view) -> None:
    """The server cancelling the request's task (shutting down) is not taken for a client's
    disconnect: the handler lets it through."""

    async def main() -> bool:
        messages = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await asyncio.Event().wait()  # the client stays
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            raise AssertionError(f"nothing is sent: {message}")

        serving = asyncio.ensure_future(application(_scope(), receive, send))
        await waiting_view["started"].wait()
        serving.cancel()
        try:
            await serving
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(main()) is True
    assert waiting_view["cancelled"] is True
