"""Fixtures for the model proxy: tokenizers, routes, credentials, an async client, and a
live uvicorn server (in a thread) for the real Anthropic SDK."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import AsyncClient

from apps.accounts.services import model_credential_issue
from apps.proxy import capture, prompt_store
from apps.proxy.models import ModelRoute
from apps.proxy.prefix_cache import cache as prefix_cache
from apps.proxy.routes import route_upsert

# Built once per machine (idempotent; ~seconds) and shared by test sessions.
TOKENIZER_DIR = Path("/tmp/synth-test-tokenizers")
ALIASES = ["claude-*", "sonnet", "opus", "haiku"]


@pytest.fixture(scope="session", autouse=True)
def qwen3_tokenizer() -> Iterator[Any]:
    from apps.proxy.tokenizers import provision, tokenizer_load

    previous = settings.SYNTH_TOKENIZER_DIR
    settings.SYNTH_TOKENIZER_DIR = TOKENIZER_DIR  # where the adapter registry loads from
    provision(["qwen3"], root=TOKENIZER_DIR)
    yield tokenizer_load("qwen3", root=TOKENIZER_DIR)
    settings.SYNTH_TOKENIZER_DIR = previous


@pytest.fixture(autouse=True)
def _isolate(monkeypatch) -> Iterator[list[str]]:
    """No broker traffic unless a test asks for it: record what would be published."""
    from apps.proxy.samplers.factory import sampler_cache_clear

    published: list[str] = []
    monkeypatch.setattr(capture, "publish_enqueue", lambda *, interaction_id: published.append(interaction_id))
    prefix_cache.clear()
    prompt_store.bases.clear()
    yield published
    sampler_cache_clear()  # scripted samplers count calls: each test starts from call 0


@pytest.fixture
def published(_isolate) -> list[str]:
    return _isolate


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def make_route(
    name: str = "qwen3-test", *, backend: str = "instant", config: dict | None = None, **kw: Any
) -> ModelRoute:
    spec: dict[str, Any] = {
        "name": name,
        "family": "qwen3",
        "tokenizer": "qwen3",
        "context_window": 32768,
        "max_output": 4096,
        "sampler_backend": backend,
        "sampler_config": config if config is not None else {},
        "aliases": ALIASES,
    }
    spec.update(kw)
    route, _ = route_upsert(**spec)
    return route


def scripted(tokenizer: Any, *texts: str) -> dict[str, Any]:
    """A scripted sampler config emitting each text (Qwen3 native markup) as one turn."""
    return {"sequences": [encode(tokenizer, t) for t in texts]}


def issue(
    org: Any, route: str, *, ttl: timedelta = timedelta(hours=1), trial: str = "trl_test", run: str = "run_test"
) -> str:
    _, secret = model_credential_issue(org=org, run_id=run, trial_id=trial, route=route, snapshot="", ttl=ttl)
    return secret


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for chunk in self.body.decode().split("\n\n"):
            if not chunk.strip():
                continue
            lines = dict(line.split(": ", 1) for line in chunk.splitlines())
            out.append((lines["event"], json.loads(lines["data"])))
        return out


def call(
    path: str,
    *,
    secret: str | None = None,
    body: Any = None,
    raw: bytes | None = None,
    method: str = "post",
    headers: dict[str, str] | None = None,
) -> Reply:
    """One request through Django's AsyncClient (the async views run in this event loop;
    thread-sensitive DB work runs on this thread, inside the test's transaction)."""

    async def run() -> Reply:
        client = AsyncClient()
        extra = {**(headers or {})}
        if secret:
            extra["x-api-key"] = secret
        if method == "get":
            response = await client.get(path, headers=extra)
        else:
            data = raw if raw is not None else json.dumps(body).encode()
            response = await client.post(path, data=data, content_type="application/json", headers=extra)
        if response.streaming:
            content = b"".join([chunk async for chunk in response.streaming_content])
        else:
            content = response.content
        return Reply(status=response.status_code, headers=dict(response.headers), body=content)

    return async_to_sync(run)()


def assert_error(reply: Reply, status: int, error_type: str) -> dict[str, Any]:
    assert reply.status == status, reply.body
    body = reply.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == error_type
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert reply.headers.get("request-id", "").startswith("req_")
    return body


# LIVE SERVER
# ------------------------------------------------------------------------------


class LiveServer:
    """An ASGI application under uvicorn in a thread, on 127.0.0.1 and a free port: the whole
    application by default, or the proxy process's (``proxy=True``)."""

    def __init__(self, *, proxy: bool = False) -> None:
        import importlib

        import uvicorn

        application = importlib.import_module("synth_project.proxy_asgi" if proxy else "synth_project.asgi").application

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(application, lifespan="off", log_level="warning"))
        self.thread = threading.Thread(target=self._run, name="uvicorn-test", daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture(scope="session")
def live_server_asgi(django_db_setup, django_db_blocker) -> Iterator[LiveServer]:
    server = LiveServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def live_proxy(django_db_setup, django_db_blocker) -> Iterator[LiveServer]:
    """The proxy process's application on its TCP listener, as interactive sessions reach it."""
    server = LiveServer(proxy=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()
