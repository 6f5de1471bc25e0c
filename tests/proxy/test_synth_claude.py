"""`synth claude`: an interactive Claude Code session on a Synth model, through the real
CLI, against a live proxy process's TCP listener (never the gateway, which samples nothing),
with a short-lived credential scoped to one route."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from apps.accounts.models import ModelCredential
from tests.conftest import make_member
from tests.proxy.conftest import issue, make_route, scripted

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
CLAUDE = ROOT / "node_modules/.bin/claude"


def run_synth(server, secret: str, *args: str, extra_env: dict[str, str] | None = None, cwd: Path | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "SYNTH_"))}
    env.update(SYNTH_API_URL=server.url, SYNTH_TOKEN=secret, SYNTH_CONFIG_DIR=str(cwd or ROOT), **(extra_env or {}))
    return subprocess.run(
        [str(ROOT / ".venv/bin/synth"), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=180
    )


def fake_claude(tmp_path: Path) -> Path:
    fake = tmp_path / "claude"
    fake.write_text('#!/bin/sh\nenv | grep -E "^(ANTHROPIC|CLAUDE_CODE|SYNTH)_" | sort\necho "ARGS $*"\n')
    fake.chmod(0o755)
    return fake


def test_the_session_gets_a_scoped_credential_not_the_operator_token(live_server_asgi, live_proxy, tmp_path, settings):
    member = make_member("team", "alice")
    make_route("qwen3-chat", backend="instant")
    fake = fake_claude(tmp_path)
    settings.SYNTH_PROXY_PUBLIC_URL = live_proxy.url
    out = run_synth(
        live_server_asgi,
        member.secret,
        "claude",
        "--model",
        "qwen3-chat",
        "--",
        "-p",
        "hi",
        extra_env={"SYNTH_CLAUDE_BIN": str(fake)},
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line and not line.startswith("ARGS"))
    assert env["ANTHROPIC_BASE_URL"] == live_proxy.url  # the proxy the server names
    assert env["ANTHROPIC_MODEL"] == env["CLAUDE_CODE_SUBAGENT_MODEL"] == "qwen3-chat"
    assert env["ANTHROPIC_AUTH_TOKEN"].startswith("synm_") and member.secret not in out.stdout
    assert "SYNTH_TOKEN" not in env  # the operator's API token stays with the CLI
    assert "ARGS -p hi" in out.stdout
    cred = ModelCredential.objects.get(org=member.org)
    assert cred.route == "qwen3-chat" and cred.run_id == "interactive"


def test_an_unreachable_proxy_is_reported_before_claude_starts(live_server_asgi, tmp_path, settings):
    member = make_member("team", "alice")
    make_route("qwen3-chat", backend="instant")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    settings.SYNTH_PROXY_PUBLIC_URL = closed
    extra = {"SYNTH_CLAUDE_BIN": str(fake_claude(tmp_path))}
    out = run_synth(live_server_asgi, member.secret, "claude", "--model", "qwen3-chat", extra_env=extra, cwd=tmp_path)
    assert out.returncode == 1 and "ARGS" not in out.stdout
    assert f"the model proxy at {closed} is not reachable" in out.stderr and "SYNTH_PROXY_URL" in out.stderr


def test_synth_proxy_url_overrides_the_address_the_server_names(live_server_asgi, live_proxy, tmp_path, settings):
    member = make_member("team", "alice")
    make_route("qwen3-chat", backend="instant")
    settings.SYNTH_PROXY_PUBLIC_URL = "http://proxy.invalid:1"
    extra = {"SYNTH_CLAUDE_BIN": str(fake_claude(tmp_path)), "SYNTH_PROXY_URL": live_proxy.url + "/"}
    out = run_synth(live_server_asgi, member.secret, "claude", "--model", "qwen3-chat", extra_env=extra, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"ANTHROPIC_BASE_URL={live_proxy.url}\n" in out.stdout


def gateway(method: str, path: str, body: bytes = b"", **headers: str) -> tuple[str, dict[str, str], Any]:
    """One request through the gateway's WSGI application, as gunicorn would make it."""
    from synth_project.wsgi import application

    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "testserver",
        "SERVER_PORT": "80",
        "HTTP_HOST": "testserver",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": io.StringIO(),
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        **{"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()},
    }
    seen: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        seen.update(status=status, headers={k.lower(): v for k, v in response_headers})

    response = application(environ, start_response)
    try:
        content = b"".join(response)
    finally:
        getattr(response, "close", lambda: None)()
    return seen["status"], seen["headers"], json.loads(content)


def test_the_gateway_serves_no_model_api_and_names_the_proxy(settings):
    member = make_member("team", "alice")
    make_route("qwen3-chat", backend="scripted", config={"sequences": []})  # a sample would fail loudly
    settings.SYNTH_PROXY_PUBLIC_URL = "https://models.example.test"
    secret = issue(member.org, "qwen3-chat")
    body = json.dumps({"model": "qwen3-chat", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    for method, path in [
        ("POST", "/v1/messages"),
        ("POST", "/v1/messages/count_tokens"),
        ("GET", "/v1/models"),
        ("GET", "/v1"),
    ]:
        status, headers, error = gateway(method, path, body.encode(), **{"x-api-key": secret})
        assert status.startswith("404"), (path, status, error)
        assert error["type"] == "error" and error["error"]["type"] == "not_found_error"
        assert "use the model proxy at https://models.example.test/v1" in error["error"]["message"]
        assert headers["request-id"].startswith("req_")
    # The rest of the gateway is as before.
    status, _, health = gateway("GET", "/healthz")
    assert status.startswith("200"), health
    status, _, runs = gateway("GET", "/api/runs", authorization=f"Bearer {member.secret}")
    assert status.startswith("200"), runs


def test_unknown_model_and_viewer_are_refused(live_server_asgi, tmp_path):
    member = make_member("team", "alice")
    viewer = make_member("team", "vera", role="viewer")
    out = run_synth(live_server_asgi, member.secret, "claude", "--model", "nope", cwd=tmp_path)
    assert out.returncode == 1 and "nope" in out.stderr and out.stderr.count("\n") == 1
    make_route("qwen3-chat", backend="instant")
    out = run_synth(live_server_asgi, viewer.secret, "claude", "--model", "qwen3-chat", cwd=tmp_path)
    assert out.returncode == 1 and "403" in out.stderr


@pytest.mark.slow
@pytest.mark.skipif(not CLAUDE.exists(), reason="Claude Code is installed by deploy/setup.sh (npm ci)")
def test_real_claude_code_prints_the_models_answer(live_server_asgi, live_proxy, tmp_path, settings, qwen3_tokenizer):
    member = make_member("team", "alice")
    make_route(
        "qwen3-chat",
        backend="scripted",
        config={**scripted(qwen3_tokenizer, "Hello from the Synth model.<|im_end|>"), "cycle": True},
    )
    settings.SYNTH_PROXY_PUBLIC_URL = live_proxy.url
    out = run_synth(
        live_server_asgi,
        member.secret,
        "claude",
        "--model",
        "qwen3-chat",
        "--",
        "-p",
        "say hello",
        "--output-format",
        "json",
        extra_env={"SYNTH_CLAUDE_BIN": str(CLAUDE), "IS_SANDBOX": "1", "HOME": str(tmp_path)},
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert "Hello from the Synth model." in result["result"]
