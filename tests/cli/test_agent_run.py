"""`synth agent run`: one local attempt with the workers' launcher and sandbox."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYNTH = str(ROOT / ".venv/bin/synth")
TASK = ROOT / "examples/tasks/implement-roman"


def synth(*args: str, cwd: Path, path: tuple[Path, ...] = ()) -> subprocess.CompletedProcess:
    """The installed `synth` on this checkout's code (``path`` first on PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    env["SYNTH_VAR_DIR"] = str(cwd / "var")
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (*path, ROOT))
    return subprocess.run([SYNTH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def no_django(root: Path) -> Path:
    """A directory whose ``django`` package cannot be imported: first on PYTHONPATH, it hides the real one."""
    package = root / "no-django" / "django"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('raise ImportError("django is not available here")\n')
    return package.parent


@pytest.mark.slow
def test_oracle_and_noop_attempts_run_locally(tmp_path):
    out = synth(
        "agent",
        "run",
        "--profile",
        f"@{ROOT}/examples/oracle-agent.json",
        "--task",
        str(TASK),
        "--json",
        "--out",
        str(tmp_path / "trials"),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["rewards"] == {"reward": 1.0} and result["error"] is None
    assert Path(result["trial_dir"]).is_dir()
    assert "DEBUG" not in out.stderr
    noop = synth(
        "agent", "run", "--profile", f"@{ROOT}/examples/noop-agent.json", "--task", str(TASK), "--json", cwd=tmp_path
    )
    assert noop.returncode == 0 and json.loads(noop.stdout)["rewards"] == {"reward": 0.0}


def test_bad_inputs_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = synth("agent", "run", "--profile", f"@{bad}", "--task", str(TASK), cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "invalid JSON" in out.stderr
    out = synth(
        "agent", "run", "--profile", f"@{ROOT}/examples/oracle-agent.json", "--task", str(tmp_path), cwd=tmp_path
    )
    assert out.returncode == 2 and "not a Harbor task folder" in out.stderr
    recipe = tmp_path / "r.json"
    recipe.write_text(
        json.dumps(
            {
                "engine": {"name": "command", "version": "1"},
                "limits": {"timeout_sec": 5},
                "command": ["true"],
                "env": {"ANTHROPIC_BASE_URL": "http://x"},
            }
        )
    )
    out = synth("agent", "run", "--profile", f"@{recipe}", "--task", str(TASK), cwd=tmp_path)
    assert out.returncode == 1 and "ANTHROPIC_BASE_URL" in out.stderr, out.stderr


@pytest.mark.slow
def test_a_cheating_agent_scores_zero_and_a_broken_verifier_is_an_error(tmp_path):
    from tests.cheats import TECHNIQUES, cheating_recipe

    recipe = tmp_path / "cheat.json"
    recipe.write_text(json.dumps(cheating_recipe(*TECHNIQUES)))
    out = synth("agent", "run", "--profile", f"@{recipe}", "--task", str(TASK), "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rewards"] == {"reward": 0.0}

    task = tmp_path / "no-reward"
    subprocess.run(["cp", "-r", str(TASK), str(task)], check=True)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 'tests need a grader'; exit 2\n")
    out = synth(
        "agent", "run", "--profile", f"@{ROOT}/examples/oracle-agent.json", "--task", str(task), "--json", cwd=tmp_path
    )
    assert out.returncode == 1
    result = json.loads(out.stdout)
    assert result["rewards"] is None and result["error"]["type"] == "VerifierError"
    assert "tests need a grader" in result["error"]["message"]


@pytest.mark.slow
def test_agent_run_needs_no_django(tmp_path):
    blocked = no_django(tmp_path)
    check = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-c", "import django"],
        env={**os.environ, "PYTHONPATH": str(blocked)},
        capture_output=True,
        text=True,
    )
    assert check.returncode != 0 and "django is not available here" in check.stderr  # the block works
    out = synth(
        "agent", "run", "--profile", f"@{ROOT}/examples/oracle-agent.json", "--task", str(TASK), "--json",
        cwd=tmp_path, path=(blocked,),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rewards"] == {"reward": 1.0}
    # The recipe's checks are the launcher's own: a reserved name is still refused, naming the field.
    recipe = tmp_path / "r.json"
    recipe.write_text(
        json.dumps(
            {
                "engine": {"name": "command", "version": "1"},
                "limits": {"timeout_sec": 5},
                "command": ["true"],
                "env": {"HTTPS_PROXY": "http://x"},
            }
        )
    )
    out = synth("agent", "run", "--profile", f"@{recipe}", "--task", str(TASK), cwd=tmp_path, path=(blocked,))
    assert out.returncode == 1 and "recipe: env.HTTPS_PROXY" in out.stderr, out.stderr
