"""`synth claude`: an interactive Claude Code session on a Synth model, through the real
CLI, against the live proxy, with a short-lived credential scoped to one route."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from apps.accounts.models import ModelCredential
from tests.conftest import make_member
from tests.proxy.conftest import make_route, scripted

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
CLAUDE = ROOT / "node_modules/.bin/claude"


def run_synth(server, secret: str, *args: str, extra_env: dict[str, str] | None = None, cwd: Path | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "SYNTH_"))}
    env.update(SYNTH_API_URL=server.url, SYNTH_TOKEN=secret, SYNTH_CONFIG_DIR=str(cwd or ROOT), **(extra_env or {}))
    return subprocess.run(
        [str(ROOT / ".venv/bin/synth"), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=180
    )


def test_the_session_gets_a_scoped_credential_not_the_operator_token(live_server_asgi, tmp_path, settings):
    member = make_member("team", "alice")
    make_route("qwen3-chat", backend="instant")
    fake = tmp_path / "claude"
    fake.write_text('#!/bin/sh\nenv | grep -E "^(ANTHROPIC|CLAUDE_CODE|SYNTH)_" | sort\necho "ARGS $*"\n')
    fake.chmod(0o755)
    settings.SYNTH_PROXY_PUBLIC_URL = live_server_asgi.url
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
    assert env["ANTHROPIC_MODEL"] == env["CLAUDE_CODE_SUBAGENT_MODEL"] == "qwen3-chat"
    assert env["ANTHROPIC_AUTH_TOKEN"].startswith("synm_") and member.secret not in out.stdout
    assert "SYNTH_TOKEN" not in env  # the operator's API token stays with the CLI
    assert "ARGS -p hi" in out.stdout
    cred = ModelCredential.objects.get(org=member.org)
    assert cred.route == "qwen3-chat" and cred.run_id == "interactive"


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
def test_real_claude_code_prints_the_models_answer(live_server_asgi, tmp_path, settings, qwen3_tokenizer):
    member = make_member("team", "alice")
    make_route(
        "qwen3-chat",
        backend="scripted",
        config={**scripted(qwen3_tokenizer, "Hello from the Synth model.<|im_end|>"), "cycle": True},
    )
    settings.SYNTH_PROXY_PUBLIC_URL = live_server_asgi.url
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
