"""From inside a real sandbox, through its model bridge, to the proxy process as deployed
(synth_project.proxy_asgi): the model API answers, nothing else does, and a flood of bad
connections leaves a few lines in the proxy's log."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest

from apps.accounts.services import model_credential_issue
from apps.proxy.routes import route_upsert
from tests.harness.conftest import proxy_start
from tests.sandbox.helpers import requires_root, requires_sandbox, started_sandbox

pytestmark = [pytest.mark.slow, requires_sandbox, requires_root]

# Raw requests (the paths go out exactly as written); one JSON line per answer.
PROBE = r"""
import json, socket, sys
key = sys.argv[1]
cases = [
    ("/admin/", "proxy", ""),
    ("/admin/login/?next=/admin/", "proxy", ""),
    ("/api/runs", "proxy", "Authorization: Bearer " + key + "\r\n"),
    ("/api/docs/", "proxy", ""),
    ("//admin/", "proxy", ""),
    ("/v1/../admin/", "proxy", ""),
    ("/v1/%2e%2e/admin/", "proxy", ""),
    ("/%61dmin/", "proxy", ""),
    ("/admin/", "admin.internal", ""),
    ("/v1/models", "proxy", "x-api-key: " + key + "\r\n"),
    ("/v1/models", "gateway.internal", "x-api-key: " + key + "\r\n"),
    ("/healthz", "proxy", ""),
]
for path, host, extra in cases:
    s = socket.create_connection(("127.0.0.1", 18080), timeout=30)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{extra}\r\n".encode())
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    headers = {k.lower(): v for k, v in headers.items()}
    print(json.dumps({"path": path, "host": host, "status": int(lines[0].split()[1]),
                      "type": headers.get("content-type", ""), "body": body.decode(errors="replace")}))
"""

FLOOD = r"""
import socket, sys
requests = {
    "websocket": b"GET /v1/messages HTTP/1.1\r\nHost: p\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    "garbage": b"\x16\x03\x01 not http at all\r\n\r\n",
    "door": b"GET /admin/ HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n",
}
n = int(sys.argv[1])
for name, request in requests.items():
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", 18080), timeout=30)
        s.sendall(request)
        try:
            while s.recv(65536):
                pass
        except ConnectionResetError:
            pass
        s.close()
print("flooded")
"""


def test_the_bridge_reaches_the_model_api_and_nothing_else(stack, alice, proxy_socket, tokenizer_dir) -> None:
    route_upsert(
        name="qwen3-port",
        family="qwen3",
        tokenizer="qwen3",
        context_window=32768,
        max_output=1024,
        sampler_backend="instant",
    )
    _cred, key = model_credential_issue(
        org=alice.org, run_id="run_port", trial_id="trl_port", route="qwen3-port", snapshot="", ttl=timedelta(hours=1)
    )
    proxy_start(stack, socket_path=proxy_socket, tokenizer_dir=tokenizer_dir)
    log = stack.tmp / "proxy.log"

    async def main() -> tuple[list[dict], int, str]:
        async with started_sandbox(model_socket=proxy_socket) as sb:
            (sb.host_path("/tmp") / "probe.py").write_text(PROBE)
            (sb.host_path("/tmp") / "flood.py").write_text(FLOOD)
            probe = await sb.exec(f"python3 /tmp/probe.py {key}")
            assert probe.return_code == 0, probe.stderr
            answers = [json.loads(line) for line in probe.stdout.splitlines()]
            before = log.stat().st_size
            flood = await sb.exec("python3 /tmp/flood.py 300")
            assert flood.stdout.strip() == "flooded", flood.stderr
            return answers, log.stat().st_size - before, log.read_text(errors="replace")

    answers, grown, text = asyncio.run(main())
    by = {(a["path"], a["host"]): a for a in answers}
    for (path, _host), answer in by.items():
        if path in ("/v1/models", "/healthz"):
            continue
        assert answer["status"] == 404, answer
        assert answer["type"] == "application/json", answer
        body = json.loads(answer["body"])
        assert body["type"] == "error" and body["error"]["type"] == "not_found_error", answer
    for host in ("proxy", "gateway.internal"):
        models = by[("/v1/models", host)]
        assert models["status"] == 200, models
        assert [m["id"] for m in json.loads(models["body"])["data"]] == ["qwen3-port"]
    assert by[("/healthz", "proxy")]["status"] == 200
    # 900 bad connections: a few lines each kind, then counts; never a traceback per connection.
    assert grown < 8_000, text[-8_000:]
    assert "Traceback" not in text and text.count("Invalid HTTP request received.") <= 5, text[-8_000:]
