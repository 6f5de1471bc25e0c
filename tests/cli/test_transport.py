"""Client behaviour that needs a misbehaving server: retries, dropped streams, bad downloads.

The server is an httpx.MockTransport, so these tests need no database.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator

import httpx
import pytest

from synth_cli import http as synth_http
from tests.cli.conftest import one_line

CANONICAL = b'{"engine":{"name":"nop","version":"1"},"limits":{"timeout_sec":60}}'
DIGEST = hashlib.sha256(CANONICAL).hexdigest()


@pytest.fixture
def server(monkeypatch) -> Callable[[Callable[[httpx.Request], httpx.Response]], None]:
    monkeypatch.setenv("SYNTH_API_URL", "http://synth.test")
    monkeypatch.setenv("SYNTH_TOKEN", "secret-token")

    def install(handler: Callable[[httpx.Request], httpx.Response]) -> None:
        monkeypatch.setattr(synth_http, "transport_factory", lambda: httpx.MockTransport(handler))

    return install


def _profile(request: httpx.Request) -> httpx.Response | None:
    if request.url.path == "/api/profiles/coder/versions/1":
        return httpx.Response(200, content=CANONICAL, headers={"X-Synth-Digest": f"sha256:{DIGEST}"})
    return None


def test_submit_retries_5xx_and_dropped_connections_with_one_idempotency_key(offline, server):
    keys: list[str] = []
    answers = iter(["drop", 503, 502, 201])

    def handler(request: httpx.Request) -> httpx.Response:
        if (profile := _profile(request)) is not None:
            return profile
        assert request.url.path == "/api/runs" and request.method == "POST"
        keys.append(request.headers["Idempotency-Key"])
        body = json.loads(request.content)
        assert body["actor"] == {"profile": "coder", "version": 1, "digest": f"sha256:{DIGEST}"}
        answer = next(answers)
        if answer == "drop":
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if answer != 201:
            return httpx.Response(answer, text="<html>bad gateway</html>")
        return httpx.Response(201, json={"id": "run_1", "kind": "evaluate", "status": "accepted", **body})

    server(handler)
    args = ("run", "start", "--dataset", "team/x@v1", "--actor", "coder@1", "--plan", "{}")
    result = offline(*args)
    assert result.exit_code == 0, result.stderr
    assert one_line(result.stdout) == "run_1"
    assert len(keys) == 4 and len(set(keys)) == 1
    expected = {
        "kind": "evaluate",
        "dataset": "team/x@v1",
        "actor": {"profile": "coder", "version": 1, "digest": f"sha256:{DIGEST}"},
        "judge": None,
        "plan": {},
    }
    canonical = json.dumps(expected, sort_keys=True, separators=(",", ":")).encode()
    assert keys[0] == hashlib.sha256(canonical).hexdigest()


def test_persistent_5xx_fails_with_one_line(offline, server, monkeypatch):
    monkeypatch.setenv("SYNTH_HTTP_RETRIES", "2")
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(503, text="<html>unavailable</html>")

    server(handler)
    result = offline("run", "show", "run_1")
    assert result.exit_code == 1
    assert one_line(result.stderr) == "synth: GET /api/runs/run_1 returned HTTP 503 Service Unavailable (503)"
    assert len(calls) == 3


class _Stream(httpx.SyncByteStream):
    """Server-sent events, then (optionally) a dropped connection."""

    def __init__(self, chunks: list[bytes], *, drop: bool) -> None:
        self.chunks, self.drop = chunks, drop

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        if self.drop:
            raise httpx.ReadError("connection reset by peer")


def _sse(seq: int) -> bytes:
    event = {"seq": seq, "type": "tick", "data": {"n": seq}, "created_at": "2026-01-01T00:00:00Z"}
    return f"id: {seq}\nevent: tick\ndata: {json.dumps(event)}\n\n".encode()


def test_follow_resumes_after_a_reset_and_a_5xx_without_duplicates(offline, server):
    seen_cursors: list[str | None] = []
    plan = iter(
        [
            ([_sse(1), _sse(2)], True),  # reset mid-stream
            ([_sse(2), _sse(3)], False),  # a server that repeats an event; then a clean close
            503,
            ([_sse(4), b'event: end\ndata: {"status": "succeeded", "after": 4}\n\n'], False),
        ]
    )

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params["follow"] == "1"
        seen_cursors.append(request.headers.get("Last-Event-ID"))
        step = next(plan)
        if step == 503:
            return httpx.Response(503, json={"error": {"type": "error", "message": "busy", "field": None}})
        chunks, drop = step
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=_Stream(chunks, drop=drop))

    server(handler)
    result = offline("run", "events", "run_1", "--follow", "--json")
    assert result.exit_code == 0, result.stderr
    assert [json.loads(line)["seq"] for line in result.stdout.splitlines()] == [1, 2, 3, 4]
    assert seen_cursors == [None, "2", "3", "3"]


def test_follow_gives_up_after_bounded_reconnects(offline, server, monkeypatch):
    monkeypatch.setenv("SYNTH_FOLLOW_RETRIES", "2")
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    server(handler)
    result = offline("run", "events", "run_1", "--follow")
    assert result.exit_code == 1
    assert one_line(result.stderr) == "synth: cannot reach http://synth.test: connection refused"
    assert len(calls) == 3


def test_artifact_downloads_are_verified(offline, server, tmp_path):
    good, bad = b"all tests passed\n", b"tampered\n"
    auth_seen: dict[str, str | None] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        auth_seen[url] = request.headers.get("Authorization")
        if request.url.path == "/api/runs/run_1/artifacts":
            return httpx.Response(
                200,
                json={
                    "results": [
                        {
                            "id": "art_1",
                            "name": "logs/a.txt",
                            "size": len(good),
                            "digest": hashlib.sha256(good).hexdigest(),
                            "download": {"url": "/files/a"},
                        },
                        {
                            "id": "art_2",
                            "name": "../../b.txt",
                            "size": len(bad),
                            "digest": "sha256:" + hashlib.sha256(b"original\n").hexdigest(),
                            "download": {"url": "https://store.test/b?sig=1"},
                        },
                    ],
                    "next": None,
                },
            )
        if url == "http://synth.test/files/a":
            return httpx.Response(200, content=good)
        if url == "https://store.test/b?sig=1":
            return httpx.Response(200, content=bad)
        return httpx.Response(404)

    server(handler)
    listed = offline("run", "artifacts", "run_1", "--json")
    assert [a["id"] for a in json.loads(listed.stdout)] == ["art_1", "art_2"]

    out = tmp_path / "out"
    result = offline("run", "artifacts", "run_1", "--download", str(out))
    assert result.exit_code == 1
    assert one_line(result.stderr).startswith("synth: artifact ../../b.txt: sha256 mismatch (expected ")
    assert (out / "logs" / "a.txt").read_bytes() == good
    # The bad file is not kept, not even partially, and nothing escaped the folder.
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["logs", "logs/a.txt"]
    assert not (tmp_path / "b.txt").exists()
    # Our token goes to our server only, never to the object store.
    assert auth_seen["http://synth.test/files/a"] == "Bearer secret-token"
    assert auth_seen["https://store.test/b?sig=1"] is None


def test_a_missing_view_is_one_clear_line_and_an_unknown_run_keeps_its_message(offline, server):
    def handler(request: httpx.Request) -> httpx.Response:
        if (profile := _profile(request)) is not None:
            return profile
        if request.url.path == "/api/runs/run_1":
            return httpx.Response(200, json={"id": "run_1", "status": "running"})
        if request.url.path.startswith("/api/runs/run_1/"):
            return httpx.Response(404, html="<h1>Not Found</h1>")  # no such route on this server
        message = {"type": "not_found", "message": "run run_2 not found", "field": None}
        return httpx.Response(404, json={"error": message})

    server(handler)
    for view in ("trials", "artifacts", "checkpoints"):
        result = offline("run", view, "run_1")
        assert result.exit_code == 1
        assert one_line(result.stderr) == f"synth: this server does not support run {view} yet"
    result = offline("run", "regrade", "run_1", "--judge", "coder@1")
    assert result.exit_code == 1
    assert one_line(result.stderr) == "synth: this server does not support run regrade yet"
    result = offline("run", "trials", "run_2")
    assert result.exit_code == 1
    assert one_line(result.stderr) == "synth: run run_2 not found (404)"
