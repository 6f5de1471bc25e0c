"""The model bridge: the sandbox's only way out, to the model proxy's Unix socket."""

from __future__ import annotations

import asyncio
import io
import logging
from pathlib import Path

import pytest

from tests.sandbox.helpers import requires_root, requires_sandbox, run, started_sandbox

pytestmark = [requires_sandbox, requires_root, pytest.mark.timeout(60)]

BIG = 1_000_000


async def _fake_proxy(path: Path, seen: list[str]) -> asyncio.Server:
    """A tiny HTTP server on a Unix socket, standing in for the platform's model proxy."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *headers = head.decode().split("\r\n")
        length = next((int(h.split(":", 1)[1]) for h in headers if h.lower().startswith("content-length:")), 0)
        body = await reader.readexactly(length) if length else b""
        seen.append(f"{request_line} {body.decode()}")
        payload = b"x" * BIG if "/big" in request_line else b'{"type": "message", "content": "hello from the proxy"}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n")
        writer.write(f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(handle, path=str(path))


def test_model_bridge_reaches_the_proxy_and_nothing_else(tmp_path: Path) -> None:
    socket_path = tmp_path / "proxy.sock"  # in a 0700 directory: only the worker can reach it

    async def main() -> None:
        seen: list[str] = []
        server = await _fake_proxy(socket_path, seen)
        try:
            async with started_sandbox(model_socket=socket_path, model_port=18080) as sb:
                assert sb.model_base_url == "http://127.0.0.1:18080"
                curl = await sb.exec(
                    "curl -s -m 10 -X POST -H 'content-type: application/json' "
                    '-d \'{"model": "m"}\' "$ANTHROPIC_BASE_URL/v1/messages"',
                    env={"ANTHROPIC_BASE_URL": sb.model_base_url},
                )
                assert curl.return_code == 0, curl.stderr
                assert "hello from the proxy" in curl.stdout
                urllib = await sb.exec(
                    'python3 -c "import urllib.request as u; '
                    "print(len(u.urlopen('http://127.0.0.1:18080/big', timeout=10).read()))\""
                )
                assert urllib.stdout.strip() == str(BIG), urllib.stderr
                # The same proxy through the Unix socket bound inside the sandbox.
                unix = await sb.exec("curl -s -m 10 --unix-socket /run/synth/model.sock http://proxy/v1/models")
                assert "hello from the proxy" in unix.stdout, unix.stderr
                assert seen[0] == 'POST /v1/messages HTTP/1.1 {"model": "m"}'
                assert len(seen) == 3
                # Other ports on the sandbox's loopback lead nowhere.
                other = await sb.exec("curl -s -m 3 http://127.0.0.1:18081/ || echo unreachable")
                assert "unreachable" in other.stdout
        finally:
            server.close()

    run(main())


def test_without_model_socket_nothing_listens() -> None:
    async def main() -> None:
        async with started_sandbox() as sb:
            assert sb.model_base_url is None
            result = await sb.exec("curl -s -m 3 http://127.0.0.1:18080/ || echo unreachable; ls /run/synth 2>&1")
            # Only the phase hooks' directories (see test_phase_boundary.py): no model socket.
            assert "unreachable" in result.stdout and result.stdout.split()[1:] == ["hooks", "observed"], result.stdout

    run(main())


# A hostile sandbox: many connections at once, or a flood of failing ones.

HOLDER = r"""
import socket, sys
n, marker = int(sys.argv[1]), sys.argv[2]
socks = []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", 18080), timeout=60)
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: m\r\n\r\n")
    socks.append(s)
open(marker, "w").close()  # every connection is open (most of them waiting for a slot)
served = 0
for s in socks:
    s.settimeout(120)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    served += b"hello from the proxy" in data
print(served)
"""


async def _counting_proxy(path: Path, release: asyncio.Event, counts: dict[str, int]) -> asyncio.Server:
    """A stand-in proxy that holds every request until `release`, counting connections at once."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counts["active"] += 1
        counts["max"] = max(counts["max"], counts["active"])
        try:
            await reader.readuntil(b"\r\n\r\n")
            await release.wait()
            payload = b"hello from the proxy"
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n")
            writer.write(f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            await writer.drain()
        finally:
            counts["active"] -= 1
            writer.close()

    return await asyncio.start_unix_server(handle, path=str(path))


async def _until(predicate: object, what: str, *, tries: int = 1200) -> None:
    for _ in range(tries):  # a bound on waiting, not a measure of speed
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def test_the_bridge_forwards_at_most_its_bound_and_the_rest_wait(tmp_path: Path) -> None:
    socket_path = tmp_path / "proxy.sock"
    bound, opened = 4, 60

    async def main() -> None:
        release = asyncio.Event()
        counts = {"active": 0, "max": 0}
        server = await _counting_proxy(socket_path, release, counts)
        try:
            async with started_sandbox(model_socket=socket_path, model_max_connections=bound) as sb:
                (sb.host_path("/tmp") / "holder.py").write_text(HOLDER)
                marker = sb.host_path("/tmp/all-open")
                holder = asyncio.ensure_future(sb.exec(f"python3 /tmp/holder.py {opened} /tmp/all-open"))
                await _until(lambda: marker.exists() or holder.done(), "the sandbox to open its connections")
                await _until(lambda: counts["active"] == bound, "the bridge to fill its slots")
                assert counts["max"] == bound  # 60 open, 4 forwarded
                release.set()
                result = await holder
                assert result.return_code == 0, result.stderr
                assert result.stdout.strip() == str(opened)  # the waiting ones were served, none lost
                assert counts["max"] == bound
        finally:
            server.close()

    run(main())


FLOOD = r"""
import socket, sys
for i in range(int(sys.argv[1])):
    s = socket.create_connection(("127.0.0.1", 18080), timeout=60)
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: m\r\n\r\n")
    s.settimeout(60)
    try:
        assert s.recv(100) == b""  # the bridge closes: the proxy is unreachable
    except ConnectionResetError:
        pass  # closed with the request unread
    s.close()
print("done")
"""


def test_a_flood_of_failing_connections_logs_a_few_lines(tmp_path: Path) -> None:
    """The proxy is down: every connection fails upstream, and the bridge says so a few times."""
    from synth_common.logfold import RepeatFolder
    from synth_sandbox import bridge

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    (folder,) = [f for f in bridge.logger.filters if isinstance(f, RepeatFolder)]
    folder._windows.clear()  # a fresh window, whatever ran before
    bridge.logger.addHandler(handler)

    async def main() -> None:
        async with started_sandbox(model_socket=tmp_path / "missing.sock", model_max_connections=8) as sb:
            (sb.host_path("/tmp") / "flood.py").write_text(FLOOD)
            result = await sb.exec("python3 /tmp/flood.py 2000")
            assert result.stdout.strip() == "done", result.stderr

    try:
        run(main())
    finally:
        bridge.logger.removeHandler(handler)
    logged = out.getvalue()
    assert logged.count("cannot reach the model proxy") == 5
    assert len(logged.encode()) < 2_000
