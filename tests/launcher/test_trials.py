"""RecipeAgent in real Harbor trials, in the local sandbox: command (three deliveries), a
stand-in claude-code, oracle, nop, a missing required output, a failing setup command."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from synth_launcher.harbor_agent import recipe_agent_config
from synth_launcher.launcher import (
    AttemptBinding,
    Bindings,
    LaunchPlan,
    ModelBinding,
    RunBinding,
    TaskBinding,
    launch_plan_build,
)

# Overridable so the same tests can run against another Harbor environment.
ENVIRONMENT = os.environ.get("SYNTH_TEST_ENVIRONMENT", "synth_sandbox.environment:LocalSandboxEnvironment")
CREDENTIAL = "sk-synth-scoped-6f1c0ffee0ddba11"


def _environment_missing() -> str | None:
    module, _, name = ENVIRONMENT.partition(":")
    try:
        getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        return f"{ENVIRONMENT} is not available: {exc}"
    return None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_environment_missing() is not None, reason=str(_environment_missing())),
]

TASK_TOML = """\
schema_version = "1.4"

[task]
name = "synth/hello-out"

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 60.0

[environment]
workdir = "/app"
"""
TEST_SH = """\
#!/bin/bash
if [ "$(cat /app/out.txt 2>/dev/null)" = "hello" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
SOLVE_SH = "#!/bin/bash\nset -euo pipefail\necho hello > /app/out.txt\n"
# A stand-in for Claude Code: it records the argv, the routing env and stdin the plan
# gives it, writes its "answer" (the instruction, its last argument) and a transcript.
FAKE_CLAUDE = """\
#!/bin/sh
printf '{"type":"system","argv":"%s"}\\n' "$*"
echo "model=$ANTHROPIC_MODEL base=$ANTHROPIC_BASE_URL key_len=${#ANTHROPIC_API_KEY} sandbox=$IS_SANDBOX" >&2
echo "headers=$ANTHROPIC_CUSTOM_HEADERS subagent=$CLAUDE_CODE_SUBAGENT_MODEL config=$CLAUDE_CONFIG_DIR" >&2
for last in "$@"; do :; done
printf '%s\\n' "$last" > /app/out.txt
if read -r line; then echo "stdin-not-empty" >&2; fi
printf '{"type":"result","subtype":"success"}\\n'
"""


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("task") / "hello-out"
    for sub in ("environment", "tests", "solution"):
        (root / sub).mkdir(parents=True)
    (root / "task.toml").write_text(TASK_TOML)
    (root / "instruction.md").write_text("hello\n")
    (root / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (root / "tests" / "test.sh").write_text(TEST_SH)
    (root / "solution" / "solve.sh").write_text(SOLVE_SH)
    return root


@dataclass
class Outcome:
    result: Any  # harbor TrialResult
    trial_dir: Path
    plan: LaunchPlan

    @property
    def reward(self) -> float | None:
        rewards = self.result.verifier_result.rewards if self.result.verifier_result else None
        return rewards.get("reward") if rewards else None

    @property
    def exception(self) -> str | None:
        info = self.result.exception_info
        return info.exception_type if info else None

    def read(self, relative: str) -> str:
        return (self.trial_dir / relative).read_text()

    def output(self, path: str) -> str:
        """A collected required output. Harbor puts /logs/artifacts at artifacts/ when the
        environment mounts it, and mirrors it (artifacts/logs/artifacts/) when it downloads it."""
        for base in ("artifacts", "artifacts/logs/artifacts"):
            candidate = self.trial_dir / base / "outputs" / path.lstrip("/")
            if candidate.is_file():
                return candidate.read_text()
        raise AssertionError(f"output {path} was not collected under {self.trial_dir / 'artifacts'}")


def _bindings(task_dir: Path, *, model: bool) -> Bindings:
    from harbor.models.task.task import Task

    task = Task(task_dir)
    return Bindings(
        task=TaskBinding(
            name=task.name,
            workdir=task.config.environment.workdir,
            instruction=task.instruction,
            agent_timeout_sec=task.config.agent.timeout_sec,
        ),
        run=RunBinding(id="run_test", kind="evaluate"),
        attempt=AttemptBinding(trial_id=f"trl_{os.urandom(4).hex()}", index=0),
        model=ModelBinding(name="qwen3-8b", base_url="http://127.0.0.1:9", route="qwen3-8b") if model else None,
        credential=CREDENTIAL if model else None,
    )


async def _trial(*, task_dir: Path, trials_dir: Path, recipe: dict[str, Any], model: bool = False) -> Outcome:
    from harbor.models.trial.config import EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    plan = launch_plan_build(recipe=recipe, bindings=_bindings(task_dir, model=model))
    config = TrialConfig(
        task=TaskConfig(path=task_dir),
        trial_name=plan.correlation_id,
        trials_dir=trials_dir,
        agent=recipe_agent_config(plan=plan),
        environment=EnvironmentConfig(import_path=ENVIRONMENT),
    )
    trial = await Trial.create(config)
    result = await trial.run()
    return Outcome(result=result, trial_dir=trials_dir / plan.correlation_id, plan=plan)


def _command(command: list[str], **extra: Any) -> dict[str, Any]:
    return {"engine": {"name": "command", "version": "1"}, "command": command, "limits": {"timeout_sec": 60}, **extra}


RECIPES: dict[str, tuple[dict[str, Any], bool]] = {
    "argument": (
        _command(
            ["sh", "-c", 'printf "%s\\n" "$1" > out.txt; cat notes.txt >&2; exit 3', "sh"],
            files=[{"path": "notes.txt", "content": "notes for the agent\n"}],
            setup=["cp notes.txt copied.txt", "test -f copied.txt"],
            outputs=["out.txt", "copied.txt"],
        ),
        False,
    ),
    "stdin": (_command(["sh", "-c", "cat > out.txt"], instruction={"via": "stdin"}, outputs=["out.txt"]), False),
    "file": (_command(["cp", "TASK.md", "out.txt"], instruction={"via": "file:TASK.md"}), False),
    "claude-code": (
        {
            "model": {"route": "qwen3-8b"},
            "engine": {"name": "claude-code", "version": "2.1"},
            "files": [{"path": "bin/claude", "content": FAKE_CLAUDE, "mode": "0755"}],
            "args": ["--max-turns", "3"],
            "env": {"PATH": "/app/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
            "outputs": ["out.txt"],
            "limits": {"timeout_sec": 60},
        },
        True,
    ),
    "oracle": ({"engine": {"name": "oracle", "version": "1"}, "limits": {"timeout_sec": 60}}, False),
    "nop": ({"engine": {"name": "nop", "version": "1"}, "limits": {"timeout_sec": 60}}, False),
    "missing-output": (_command(["true"], outputs=["out.txt", "/logs/agent/report.json"]), False),
    "setup-fails": (_command(["true"], setup=["echo boom; exit 4"]), False),
}


@pytest.fixture(scope="module")
def outcomes(task_dir, tmp_path_factory) -> dict[str, Outcome]:
    """All trials at once (they are independent): keeps the module well under a minute."""
    trials_dir = tmp_path_factory.mktemp("trials")

    async def main() -> dict[str, Outcome]:
        names = list(RECIPES)
        done = await asyncio.gather(
            *(
                _trial(task_dir=task_dir, trials_dir=trials_dir, recipe=RECIPES[n][0], model=RECIPES[n][1])
                for n in names
            )
        )
        return dict(zip(names, done, strict=True))

    return asyncio.run(main())


def test_command_argument(outcomes):
    out = outcomes["argument"]
    assert out.exception is None and out.reward == 1.0
    # A non-zero exit is recorded, not raised: verification decided the reward.
    assert out.read("agent/exit-code.txt").strip() == "3"
    metadata = out.result.agent_result.metadata
    assert metadata["engine"] == "command" and metadata["exit_code"] == 3
    assert metadata["launch_plan_digest"] == out.plan.digest()
    assert metadata["argv"][:3] == ["sh", "-c", 'printf "%s\\n" "$1" > out.txt; cat notes.txt >&2; exit 3']
    assert metadata["argv"][-1].startswith("<instruction")
    assert "notes for the agent" in out.read("agent/command.txt")
    # Required outputs are collected as artifacts, under their absolute path.
    assert out.output("/app/out.txt") == "hello\n"
    assert out.output("/app/copied.txt") == "notes for the agent\n"
    assert json.loads(out.read("agent/launch-plan.json")) == out.plan.to_dict()


def test_command_stdin(outcomes):
    out = outcomes["stdin"]
    assert out.exception is None and out.reward == 1.0
    assert out.result.agent_result.metadata["exit_code"] == 0


def test_command_file(outcomes):
    out = outcomes["file"]
    assert out.exception is None and out.reward == 1.0
    assert "hello" not in out.plan.argv


def test_claude_code_launch(outcomes):
    out = outcomes["claude-code"]
    assert out.exception is None and out.reward == 1.0
    transcript = out.read("agent/claude-code.jsonl")
    assert (
        "--print --output-format stream-json --verbose --permission-mode bypassPermissions --max-turns 3 hello"
        in transcript
    )
    assert '"type":"result"' in transcript
    log = out.read("agent/claude-code.txt")
    assert "model=qwen3-8b base=http://127.0.0.1:9" in log
    assert f"key_len={len(CREDENTIAL)}" in log and "sandbox=1" in log
    assert f"headers=x-synth-trial: {out.plan.correlation_id}" in log
    assert "subagent=qwen3-8b config=/logs/agent/sessions" in log
    assert "stdin-not-empty" not in log
    # The scoped credential appears in no file of the trial (config, logs, plan, result).
    for path in out.trial_dir.rglob("*"):
        if path.is_file():
            assert CREDENTIAL not in path.read_text(errors="replace"), path


def test_oracle(outcomes):
    out = outcomes["oracle"]
    assert out.exception is None and out.reward == 1.0
    assert out.result.agent_result.metadata["engine"] == "oracle"
    assert out.result.agent_result.metadata["exit_code"] == 0
    assert (out.trial_dir / "agent" / "oracle.txt").is_file()


def test_nop(outcomes):
    out = outcomes["nop"]
    assert out.exception is None and out.reward == 0.0
    assert out.result.agent_result.metadata["exit_code"] is None


def test_missing_required_output(outcomes):
    out = outcomes["missing-output"]
    assert out.exception == "RequiredOutputMissing"
    message = out.result.exception_info.exception_message
    assert "/app/out.txt" in message and "/logs/agent/report.json" in message
    assert out.reward in (None, 0.0)


def test_setup_failure_names_the_command(outcomes):
    out = outcomes["setup-fails"]
    assert out.exception == "SetupCommandFailed"
    message = out.result.exception_info.exception_message
    assert "setup[0]" in message and "exited 4" in message and "boom" in message
    assert out.reward is None
