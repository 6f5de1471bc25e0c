"""Real Harbor trials on the local sandbox, and tasks it must refuse before starting."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from harbor.models.task.config import TaskConfig as TaskToml
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial

from synth_sandbox import ENVIRONMENT_IMPORT_PATH
from synth_sandbox.support import UnsupportedTaskError, check_task_supported, describe_task_support
from tests.sandbox.helpers import BASE_DIR, requires_root, requires_sandbox, run

pytestmark = [requires_sandbox, pytest.mark.timeout(60)]

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

TASK_TOML = """\
schema_version = "1.4"

[task]
name = "synth-tests/hello-file"

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = {agent_timeout}

[environment]
workdir = "/app"
cpus = 1
memory_mb = 512
storage_mb = 256
{extra}
"""


def make_task(root: Path, *, extra: str = "", agent_timeout: float = 60.0, solve: str | None = None) -> Path:
    task = root / "hello-file"
    (task / "environment" / "app").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text(TASK_TOML.format(extra=extra, agent_timeout=agent_timeout))
    (task / "instruction.md").write_text("Write the greeting from /app/greeting.txt into /app/hello.txt.\n")
    (task / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\nCOPY app/ /app/\n")
    # Initial workdir contents: the Dockerfile's COPY app/ /app/ is applied at start.
    (task / "environment" / "app" / "greeting.txt").write_text("Hello, world!\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        'if [ "$(cat /app/hello.txt 2>/dev/null)" = "Hello, world!" ]; then\n'
        "  echo 1 > /logs/verifier/reward.txt\n"
        "else\n"
        "  echo 0 > /logs/verifier/reward.txt\n"
        "fi\n"
    )
    (task / "solution" / "solve.sh").write_text(
        solve or "#!/bin/bash\nset -euo pipefail\ncp /app/greeting.txt /app/hello.txt\n"
    )
    return task


def trial_config(task: Path, trials: Path, agent: str, **env_kwargs: object) -> TrialConfig:
    return TrialConfig(
        task=TaskConfig(path=task),
        trials_dir=trials,
        agent=AgentConfig(name=agent),
        environment=EnvironmentConfig(
            import_path=ENVIRONMENT_IMPORT_PATH,
            kwargs={"sandbox_root": str(BASE_DIR / "harbor"), **env_kwargs},
        ),
    )


def _sandboxes() -> set[str]:
    base = BASE_DIR / "harbor"
    return {p.name for p in base.iterdir()} if base.exists() else set()


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
def test_harbor_trial(tmp_path: Path, agent: str, reward: float) -> None:
    task = make_task(tmp_path)
    before = _sandboxes()

    async def main() -> None:
        trial = await Trial.create(trial_config(task, tmp_path / "trials", agent))
        result = await trial.run()
        assert result.exception_info is None, result.exception_info
        assert result.verifier_result is not None
        assert result.verifier_result.rewards == {"reward": reward}
        env = trial.agent_environment
        if os.geteuid() == 0:
            assert {"memory_mb", "pids_max", "cpus", "storage_mb"} <= set(env.enforced_limits)  # type: ignore[attr-defined]
            assert env.enforced_limits["memory_mb"] == 512  # type: ignore[attr-defined]
        trial_dir = tmp_path / "trials" / result.trial_name
        assert (trial_dir / "verifier" / "reward.txt").read_text().strip() in ("1", "0")
        if agent == "oracle":
            assert (trial_dir / "agent" / "oracle.txt").exists()

    run(main())
    assert _sandboxes() == before  # stop(delete=True) removed the sandbox directory


@requires_root
def test_harbor_agent_timeout_kills_the_agent(tmp_path: Path) -> None:
    marker = "synth-agent-timeout-marker"
    task = make_task(
        tmp_path,
        agent_timeout=2.0,
        solve=f"#!/bin/bash\npython3 -c 'import time; time.sleep(300)' {marker} &\nsleep 300\n",
    )

    async def main() -> None:
        trial = await Trial.create(trial_config(task, tmp_path / "trials", "oracle"))
        result = await trial.run()
        assert result.exception_info is not None
        assert result.exception_info.exception_type == "AgentTimeoutError"
        assert result.verifier_result is not None and result.verifier_result.rewards == {"reward": 0.0}

    run(main())
    from tests.sandbox.helpers import processes_with_marker

    assert processes_with_marker(marker) == []


@pytest.mark.parametrize(
    ("extra", "files", "expected"),
    [
        ("gpus = 1", {}, "GPU"),
        ('docker_image = "nvidia/cuda:12.4.0-devel-ubuntu22.04"', {}, "nvidia/cuda"),
        ('os = "windows"', {"tests/test.bat": "echo 1 > C:/logs/verifier/reward.txt\n"}, "Windows"),
        ("", {"environment/docker-compose.yaml": "services:\n  main:\n    build: .\n"}, "docker-compose.yaml"),
        ("", {"environment/Dockerfile": "FROM node:20\nRUN npm i -g x\n"}, "node:20"),
        ("", {"environment/Dockerfile": "FROM ubuntu:24.04\nUSER app\n"}, "line 2 (USER app)"),
        ('network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]', {}, "allowlist"),
    ],
)
def test_unsupported_tasks_are_rejected_before_start(
    tmp_path: Path, extra: str, files: dict[str, str], expected: str
) -> None:
    task = make_task(tmp_path, extra=extra)
    for name, content in files.items():
        (task / name).write_text(content)
    message = check_task_supported(task)
    assert message is not None and expected in message and message.startswith("local sandbox cannot run this task")
    before = _sandboxes()

    async def main() -> None:
        with pytest.raises((UnsupportedTaskError, ValueError, RuntimeError)) as info:
            await Trial.create(trial_config(task, tmp_path / "trials", "oracle"))
        # Harbor's own network validation may speak first for allowlists; either way, clearly.
        assert expected in str(info.value) or "allowlist" in str(info.value)

    asyncio.run(main())
    assert _sandboxes() == before  # nothing was started


def test_supported_task_and_warnings(tmp_path: Path) -> None:
    task = make_task(tmp_path, extra='docker_image = "python:3.12-slim"')
    assert check_task_supported(task) is None
    # As with Docker, a prebuilt docker_image is used as it is: its Dockerfile is not applied
    # (so not refused either), and the report says so.
    (task / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nUSER app\n")
    report = describe_task_support(task)
    assert report.supported and any("Dockerfile is not applied" in w for w in report.warnings)
    # A parsed task.toml alone can be checked too (no file checks).
    config = TaskToml.model_validate_toml((task / "task.toml").read_text().replace("cpus = 1", "cpus = 1\ngpus = 2"))
    assert "2 GPU(s)" in (check_task_supported(config) or "")
