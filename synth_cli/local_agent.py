"""`synth agent run`: one attempt on a local task folder, with the launcher and sandbox the
trials workers use (synth_launcher.launcher, synth_launcher.harbor_agent, the local bubblewrap
sandbox). Unlike every other command this one executes locally, so it imports the
execution packages, lazily (`synth --help` and the HTTP commands never do). They are
Django-free, as is everything here: no server code, no settings.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synth_cli.errors import CliError, UsageError


@dataclass
class LocalAttempt:
    trial_dir: Path
    rewards: dict[str, Any] | None
    error_type: str | None
    error_message: str | None
    launch_plan_digest: str


def _logging_quiet() -> None:
    # Harbor's progress lines would drown the one result this prints: warnings and errors only.
    # Harbor pins its logger to DEBUG when imported, so import it first, then lower it.
    import harbor.utils.logger  # noqa: F401

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("harbor.utils.logger").setLevel(logging.WARNING)


def agent_run_local(*, recipe: dict[str, Any], task_dir: Path, out_dir: Path | None) -> LocalAttempt:
    if not (task_dir / "task.toml").is_file():
        raise UsageError(f"{task_dir}: not a Harbor task folder (no task.toml)")
    # litellm (which Harbor imports) would otherwise fetch its model cost table from the network.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    _logging_quiet()
    from harbor.models.task.task import Task as HarborTask
    from harbor.models.trial.config import EnvironmentConfig, TrialConfig
    from harbor.models.trial.config import TaskConfig as HarborTaskConfig
    from harbor.trial.trial import Trial as HarborTrial

    from synth_launcher.harbor_agent import recipe_agent_config
    from synth_launcher.launcher import (
        AttemptBinding,
        Bindings,
        LaunchError,
        RunBinding,
        TaskBinding,
        launch_plan_build,
    )
    from synth_sandbox import ENVIRONMENT_IMPORT_PATH
    from synth_sandbox.boundary import VERIFIER_ERROR, trial_boundary_install

    try:
        harbor_task = HarborTask(task_dir)
    except Exception as exc:  # harbor raises several types for a malformed task
        raise UsageError(f"{task_dir}: {exc}") from None
    attempt_id = f"local-{uuid.uuid4().hex[:12]}"
    bindings = Bindings(
        task=TaskBinding(
            name=harbor_task.name,
            workdir=harbor_task.config.environment.workdir or "/app",
            instruction=harbor_task.instruction,
            agent_timeout_sec=harbor_task.config.agent.timeout_sec,
        ),
        run=RunBinding(id="local", kind="execute"),
        attempt=AttemptBinding(trial_id=attempt_id, index=0),
    )
    try:
        plan = launch_plan_build(recipe=recipe, bindings=bindings)
    except LaunchError as exc:  # the recipe's own checks (RecipeInvalid) included
        raise CliError(f"recipe: {exc.field + ': ' if exc.field else ''}{exc.message}") from None
    trials_dir = out_dir or Path(tempfile.mkdtemp(prefix="synth-agent-"))
    config = TrialConfig(
        task=HarborTaskConfig(path=task_dir.resolve()),
        trial_name=attempt_id,
        trials_dir=trials_dir,
        agent=recipe_agent_config(plan=plan, task_dir=task_dir.resolve()),
        environment=EnvironmentConfig(import_path=ENVIRONMENT_IMPORT_PATH),
    )

    async def main() -> tuple[Any, str | None]:
        trial = await HarborTrial.create(config)
        # The same phase boundary as on a trials worker: the agent's processes are gone and
        # the verifier's needs are checked before a reward counts.
        boundary = trial_boundary_install(trial=trial)
        try:
            result = await trial.run()
            return result, boundary.verifier_failure(result=result)
        finally:
            boundary.close()

    try:
        result, verifier_failure = asyncio.run(main())
    except Exception as exc:  # e.g. the sandbox refuses the task before it starts
        raise CliError(f"{task_dir}: {exc}") from None
    info = result.exception_info
    if verifier_failure is not None:
        error_type, error_message, rewards = VERIFIER_ERROR, verifier_failure, None
    else:
        error_type = info.exception_type if info else None
        error_message = info.exception_message if info else None
        rewards = result.verifier_result.rewards if result.verifier_result else None
    return LocalAttempt(
        trial_dir=trials_dir / attempt_id,
        rewards=rewards,
        error_type=error_type,
        error_message=error_message,
        launch_plan_digest=plan.digest(),
    )
