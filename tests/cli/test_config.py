from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys

import pytest

from tests.cli.conftest import one_line

pytestmark = pytest.mark.django_db(transaction=True)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_login_writes_a_private_config_that_later_commands_use(live_server, alice, offline, cli_env):
    result = offline("login", "--url", live_server.url + "/", "--token", alice.secret)
    assert result.exit_code == 0, result.stderr
    path = cli_env / "config.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(cli_env).st_mode) == 0o700
    assert json.loads(path.read_text()) == {"url": live_server.url, "token": alice.secret}
    assert alice.secret not in result.stdout
    # No environment: the file is what the next command uses.
    assert offline.json("run", "list") == []


def test_login_prompts_for_what_is_missing(live_server, alice, offline, cli_env):
    result = offline("login", "--url", live_server.url, input=f"{alice.secret}\n")
    assert result.exit_code == 0, result.stderr
    assert alice.secret not in result.stdout  # the prompt hides the token
    assert json.loads((cli_env / "config.json").read_text())["token"] == alice.secret


def test_login_with_a_bad_token_fails_in_one_line_and_writes_nothing(live_server, offline, cli_env):
    result = offline("login", "--url", live_server.url, "--token", "not-a-token")
    assert result.exit_code == 1
    assert one_line(result.stderr).startswith("synth: the server rejected the token (401): ")
    assert not (cli_env / "config.json").exists()


def test_environment_overrides_the_config_file(live_server, alice, offline, monkeypatch):
    assert offline("login", "--url", live_server.url, "--token", alice.secret).exit_code == 0
    monkeypatch.setenv("SYNTH_TOKEN", "wrong")
    result = offline("run", "list")
    assert result.exit_code == 1
    assert "rejected the token (401)" in one_line(result.stderr)


@pytest.mark.django_db(transaction=False)
def test_unreachable_server_is_one_line_and_exit_1(offline, monkeypatch):
    port = _closed_port()
    monkeypatch.setenv("SYNTH_API_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("SYNTH_TOKEN", "t")
    monkeypatch.setenv("SYNTH_HTTP_RETRIES", "1")
    result = offline("run", "show", "run_x")
    assert result.exit_code == 1
    assert one_line(result.stderr) == f"synth: cannot reach http://127.0.0.1:{port}: connection refused"
    assert result.stdout == ""


@pytest.mark.django_db(transaction=False)
def test_no_configuration_says_how_to_log_in(offline):
    result = offline("run", "list")
    assert result.exit_code == 1
    assert "synth login" in one_line(result.stderr)


@pytest.mark.django_db(transaction=False)
def test_help_reads_for_every_command(offline):
    commands = [
        [],
        ["login"],
        ["claude"],
        ["run"],
        *[
            ["run", c]
            for c in (
                "start",
                "show",
                "list",
                "events",
                "cancel",
                "trials",
                "artifacts",
                "checkpoints",
                "updates",
                "regrade",
            )
        ],
        ["train"],
        ["train", "start"],
        ["dataset"],
        ["dataset", "push"],
        ["dataset", "show"],
        ["profile"],
        ["profile", "publish"],
        ["profile", "show"],
        ["agent"],
        ["agent", "run"],
    ]
    for args in commands:
        result = offline(*args, "--help")
        assert result.exit_code == 0, (args, result.output)
        assert "Usage: synth" in result.stdout
    assert "Examples" in offline("--help").stdout
    assert offline("--version").stdout.startswith("synth ")


@pytest.mark.django_db(transaction=False)
def test_claude_without_a_server_is_one_line(offline, tmp_path):
    result = offline("claude", "--model", "qwen3-8b", "-p", "hello")
    assert result.exit_code == 1
    assert "no server URL configured" in one_line(result.stderr)


@pytest.mark.django_db(transaction=False)
def test_the_cli_speaks_http_only_and_runs_as_a_program():
    """No Django, no apps.*: the client must work on a machine without the server code."""
    code = (
        "import sys, synth_cli.main; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'apps', 'rest_framework')); "
        "assert not bad, bad"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    result = subprocess.run(
        [sys.executable, "-m", "synth_cli.main", "--help"], capture_output=True, text=True, env=env, check=True
    )
    assert "Usage: synth" in result.stdout


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("SYNTH_HTTP_RETRIES", "many", "must be a whole number, not 'many'"),
        ("SYNTH_HTTP_RETRIES", "-1", "must be at least 0, not -1"),
        ("SYNTH_HTTP_RETRY_WAIT", "soon", "must be a number of seconds, not 'soon'"),
        ("SYNTH_HTTP_RETRY_WAIT", "nan", "must be a non-negative number of seconds, not 'nan'"),
    ],
)
def test_tuning_that_does_not_parse_is_a_usage_error(offline, monkeypatch, name, value, problem):
    """Strict, not a silent default: the command stops before it sends anything (exit 2)."""
    port = _closed_port()
    monkeypatch.setenv("SYNTH_API_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("SYNTH_TOKEN", "t")
    monkeypatch.setenv(name, value)
    result = offline("run", "show", "run_x")
    assert result.exit_code == 2
    assert one_line(result.stderr) == f"synth: {name} {problem}"


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize(("name", "value"), [("SYNTH_FOLLOW_SERVER_TIMEOUT", "0"), ("SYNTH_FOLLOW_RETRIES", "2.5")])
def test_follow_tuning_that_does_not_parse_is_a_usage_error(offline, monkeypatch, name, value):
    monkeypatch.setenv("SYNTH_API_URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("SYNTH_TOKEN", "t")
    monkeypatch.setenv("SYNTH_HTTP_RETRIES", "0")
    monkeypatch.setenv(name, value)
    result = offline("run", "events", "run_x", "--follow")
    assert result.exit_code == 2
    assert one_line(result.stderr).startswith(f"synth: {name} must be ")
