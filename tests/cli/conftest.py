"""Drive the real `synth` app in-process (typer's CliRunner) against a live test server."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from synth_cli.main import app
from tests.harness.conftest import tokenizer_dir  # noqa: F401 - a fixture (the harness check of a train run)

EXAMPLE_RECIPE = {
    "model": {"route": "qwen3-8b"},
    "engine": {"name": "claude-code", "version": "2.1"},
    "files": [{"path": "CLAUDE.md", "content": "Run the tests before you finish.", "mode": "0644"}],
    "args": ["--max-turns", "40"],
    "limits": {"timeout_sec": 1800},
}


@dataclass
class Synth:
    """`synth(...)` runs one command; results carry exit_code, stdout and stderr apart."""

    run: Callable[..., Result]
    tmp: Path

    def __call__(self, *args: str, input: str | None = None) -> Result:
        return self.run(*args, input=input)

    def json(self, *args: str) -> object:
        result = self.run(*args, "--json")
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return json.loads(result.stdout)


def _invoke(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(app, list(args), input=input)


@pytest.fixture(autouse=True)
def cli_env(tmp_path, monkeypatch) -> Path:
    """A private config dir, no inherited server settings, and quick retries."""
    config = tmp_path / "synth-config"
    monkeypatch.setenv("SYNTH_CONFIG_DIR", str(config))
    monkeypatch.delenv("SYNTH_API_URL", raising=False)
    monkeypatch.delenv("SYNTH_TOKEN", raising=False)
    monkeypatch.delenv("SYNTH_FOLLOW_SERVER_TIMEOUT", raising=False)
    monkeypatch.setenv("SYNTH_HTTP_RETRY_WAIT", "0.01")
    return config


@pytest.fixture
def synth(live_server, alice, tmp_path, monkeypatch) -> Synth:
    """The CLI pointed at the live server with alice's token (through the environment)."""
    monkeypatch.setenv("SYNTH_API_URL", live_server.url)
    monkeypatch.setenv("SYNTH_TOKEN", alice.secret)
    return Synth(run=_invoke, tmp=tmp_path)


@pytest.fixture
def offline(tmp_path) -> Synth:
    """The CLI without a server (for local checks and mocked transports)."""
    return Synth(run=_invoke, tmp=tmp_path)


@pytest.fixture
def recipe_file(tmp_path) -> Path:
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(EXAMPLE_RECIPE, indent=2))
    return path


def make_task(root: Path, name: str, *, instruction: str = "Write hello.txt.") -> Path:
    """A minimal valid Harbor task folder."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text(
        'version = "1.0"\n\n[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 120.0\n'
    )
    (task / "instruction.md").write_text(instruction + "\n")
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    test = task / "tests" / "test.sh"
    test.write_text("#!/bin/bash\ntest -f /app/hello.txt && echo 1 > /logs/verifier/reward.txt\n")
    test.chmod(0o755)
    solve = task / "solution" / "solve.sh"
    solve.write_text("#!/bin/bash\necho hello > /app/hello.txt\n")
    solve.chmod(0o755)
    return task


def one_line(text: str) -> str:
    """The text, asserted to be exactly one line."""
    lines = text.strip("\n").splitlines()
    assert len(lines) == 1, text
    return lines[0]
