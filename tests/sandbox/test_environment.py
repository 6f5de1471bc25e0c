"""LocalSandboxEnvironment used directly, as a worker would (no Trial)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from harbor.models.task.config import TaskConfig as TaskToml
from harbor.models.trial.paths import TrialPaths

from synth_sandbox.environment import LocalSandboxEnvironment
from synth_sandbox.support import UnsupportedTaskError
from tests.sandbox.helpers import BASE_DIR, requires_root, requires_sandbox, run
from tests.sandbox.test_harbor import make_task

pytestmark = [requires_sandbox, pytest.mark.timeout(60)]


def _environment(task: Path, trial_dir: Path, **kwargs: object) -> LocalSandboxEnvironment:
    config = TaskToml.model_validate_toml((task / "task.toml").read_text())
    return LocalSandboxEnvironment(
        environment_dir=task / "environment",
        environment_name=task.name,
        session_id="direct__abc1234__env",
        trial_paths=TrialPaths(trial_dir),
        task_env_config=config.environment,
        sandbox_root=str(BASE_DIR / "direct"),
        **kwargs,  # type: ignore[arg-type]
    )


@requires_root
def test_environment_limits_env_and_workdir(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    task = make_task(tmp_path)
    env = _environment(
        task,
        tmp_path / "trial",
        override_memory_mb=300,
        override_cpus=0.5,
        persistent_env={"PERSISTENT": "yes"},
        pids_max="128",  # --ek values arrive as strings
    )
    assert env.enforced_limits == {}  # nothing before start
    assert env.capabilities.disable_internet and not env.capabilities.mounted

    async def main() -> None:
        await env.start(force_build=False)
        try:
            assert env.enforced_limits == {"memory_mb": 300, "cpus": 0.5, "pids_max": 128, "storage_mb": 256}
            assert env.unenforced_limits == {}
            with caplog.at_level(logging.WARNING):
                result = await env.exec(
                    "pwd; cat greeting.txt; echo $PERSISTENT $PER_EXEC", env={"PER_EXEC": "too"}, user="agent"
                )
            assert result.stdout == "/app\nHello, world!\nyes too\n" and result.return_code == 0
            assert any("instead of user 'agent'" in r.getMessage() for r in caplog.records)
            assert await env.is_file("/app/greeting.txt") and await env.is_dir("/logs/verifier")
            assert env.model_base_url is None
        finally:
            await env.stop(delete=True)
        assert not env.sandbox.path.exists()

    run(main())


def test_unknown_option_and_unsupported_task_fail_at_construction(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    with pytest.raises(ValueError, match="Unknown option 'no_such_option'"):
        _environment(task, tmp_path / "trial", no_such_option=1)
    (task / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(UnsupportedTaskError, match="docker-compose.yaml"):
        _environment(task, tmp_path / "trial")
