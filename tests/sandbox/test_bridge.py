"""The model bridge: the sandbox's only way out, to the model proxy's Unix socket."""

from __future__ import annotations

import asyncio
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
