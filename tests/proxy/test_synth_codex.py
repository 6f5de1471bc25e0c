"""`synth codex`: an interactive Codex session on a Synth model, through the real CLI, against a
live proxy process's TCP listener, with a short-lived credential scoped to one route and a
private CODEX_HOME whose config.toml names the proxy as a Responses provider."""

from __future__ import annotations

import socket
import stat
import tomllib
from pathlib import Path

import pytest

from apps.accounts.models import ModelCredential
from apps.proxy.models import Interaction
from synth_cli.codex_session import CREDENTIAL_ENV
from tests.conftest import make_member
from tests.proxy.conftest import make_route, scripted
from tests.proxy.test_synth_claude import run_synth

pytestmark = pytest.mark.django_db(transaction=True)


def fake_codex(tmp_path: Path) -> Path:
    (tmp_path / "bin").mkdir(exist_ok=True)
    fake = tmp_path / "bin" / "codex"
    fake.write_text(
        "#!/bin/sh\n"
        'env | grep -E "^(OPENAI|CODEX|SYNTH)_" | sort\n'
        'echo "ARGS $*"\n'
        'echo "--- config"; cat "$CODEX_HOME/config.toml"\n'
    )
    fake.chmod(0o755)
    return fake


def _env_and_config(stdout: str) -> tuple[dict[str, str], dict]:
    head, _, config = stdout.partition("--- config\n")
    env = dict(line.split("=", 1) for line in head.splitlines() if "=" in line and not line.startswith("ARGS"))
    return env, tomllib.loads(config)


def test_the_session_gets_a_private_codex_home_and_a_scoped_credential(
    live_server_asgi, live_proxy, tmp_path, settings
):
    member = make_member("team", "alice")
    make_route("qwen3-chat", backend="instant")
    settings.SYNTH_PROXY_PUBLIC_URL = live_proxy.url
    extra = {"SYNTH_CODEX_BIN": str(fake_codex(tmp_path)), "OPENAI_API_KEY": "sk-operator", "CODEX_HOME": "/nope"}
    out = run_synth(
        live_server_asgi,
        member.secret,
        "codex",
        "--model",
        "qwen3-chat",
        "--",
        "exec",
        "hi",
        extra_env=extra,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    env, config = _env_and_config(out.stdout)
    home = Path(env["CODEX_HOME"])
    assert home == tmp_path / "codex"  # under SYNTH_CONFIG_DIR, not the operator's own
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "config.toml").stat().st_mode) == 0o600
    assert config["model"] == "qwen3-chat"
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == f"{live_proxy.url}/v1" and provider["wire_api"] == "responses"
    assert provider["env_key"] == CREDENTIAL_ENV
    secret = env[CREDENTIAL_ENV]
    assert secret.startswith("synm_") and secret not in (home / "config.toml").read_text()
    # Neither the operator's API token nor an OpenAI key reaches Codex.
    assert "SYNTH_TOKEN" not in env and "OPENAI_API_KEY" not in env and member.secret not in out.stdout
    assert "ARGS exec hi" in out.stdout
    cred = ModelCredential.objects.get(org=member.org)
    assert cred.route == "qwen3-chat" and cred.run_id == "interactive"

    # A second session rewrites the config (another route) and keeps what Codex stored.
    (home / "sessions").mkdir()
    make_route("qwen3-other", backend="instant")
    out = run_synth(live_server_asgi, member.secret, "codex", "--model", "qwen3-other", extra_env=extra, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert _env_and_config(out.stdout)[1]["model"] == "qwen3-other" and (home / "sessions").is_dir()


def test_an_unreachable_proxy_is_reported_before_codex_starts(live_server_asgi, tmp_path, settings):
    member = make_member("team", "alice")
    make_route("qwen3-chat", backend="instant")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    settings.SYNTH_PROXY_PUBLIC_URL = closed
    extra = {"SYNTH_CODEX_BIN": str(fake_codex(tmp_path))}
    out = run_synth(live_server_asgi, member.secret, "codex", "--model", "qwen3-chat", extra_env=extra, cwd=tmp_path)
    assert out.returncode == 1 and "ARGS" not in out.stdout
    assert f"the model proxy at {closed} is not reachable" in out.stderr
    assert not (tmp_path / "codex").exists()  # nothing written for a session that cannot start


def test_unknown_model_is_refused(live_server_asgi, tmp_path):
    member = make_member("team", "alice")
    extra = {"SYNTH_CODEX_BIN": str(fake_codex(tmp_path))}
    out = run_synth(live_server_asgi, member.secret, "codex", "--model", "nope", extra_env=extra, cwd=tmp_path)
    assert out.returncode == 1 and "nope" in out.stderr and "ARGS" not in out.stdout


@pytest.mark.slow
def test_real_codex_prints_the_models_answer(live_server_asgi, live_proxy, tmp_path, settings, qwen3_tokenizer):
    from django.conf import settings as django_settings

    # The node launcher npm installs (package.json pins @openai/codex), as an operator runs it.
    launcher = Path(django_settings.SYNTH_CODEX_SANDBOX_BIN).parents[5] / ".bin" / "codex"
    assert launcher.exists(), f"{launcher} is missing: run `npm ci` in the repository root"
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
        "codex",
        "--model",
        "qwen3-chat",
        "--",
        "exec",
        "--skip-git-repo-check",
        "--ephemeral",
        "-c",
        "features.plugins=false",
        "say hello",
        extra_env={"SYNTH_CODEX_BIN": str(launcher), "HOME": str(tmp_path)},
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Hello from the Synth model." in out.stdout
    calls = Interaction.objects.filter(org=member.org)
    assert calls.exists() and {c.protocol for c in calls} == {"responses"}
    assert {c.run_id for c in calls} == {"interactive"}  # the session's credential, no attempt
