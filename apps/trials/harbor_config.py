"""Harbor's TrialConfig for one attempt: the environment, the agent, the verifier (the task's
tests or the run's judge), and what is collected from the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apps.runs.models import RunKind, Trial
from apps.trials.model_access import ModelAccess, environment_import_path, sandbox_model_options


def trial_config(
    *,
    trial: Trial,
    task_dir: Path,
    trials_dir: Path,
    launch_plan: Any,
    access: ModelAccess | None = None,
    judge_plan: Any = None,
    judge_access: ModelAccess | None = None,
    agent_config: Any = None,
) -> Any:
    """The attempt's TrialConfig. ``agent_config`` is a regrade's restore agent; without it
    the agent is the recipe agent running ``launch_plan``. With ``judge_plan``, the verifier
    is the run's judge (apps.trials.judges) instead of the task's tests."""
    from harbor.models.trial.config import TaskConfig as HarborTaskConfig
    from harbor.models.trial.config import TrialConfig

    from synth_launcher.harbor_agent import recipe_agent_config

    plan = trial.run.spec.plan
    if agent_config is None:
        agent_config = recipe_agent_config(plan=launch_plan, task_dir=task_dir)
        if _sanitize_git(plan=plan, task_dir=task_dir):
            agent_config.kwargs["sanitize_git"] = True
    if plan.get("agent_timeout_sec"):
        agent_config.override_timeout_sec = plan["agent_timeout_sec"]
    return TrialConfig(
        task=HarborTaskConfig(path=task_dir),
        trial_name=trial.id,
        trials_dir=trials_dir,
        timeout_multiplier=plan.get("timeout_multiplier", 1.0),
        agent=agent_config,
        # The sandbox's model bridge serves the actor and the judge alike (each call carries
        # its own credential); either one needing a model is enough to set it up.
        environment=_environment_config(plan=plan, access=access or judge_access),
        verifier=_verifier_config(trial=trial, judge_plan=judge_plan),
        artifacts=_artifacts(trial=trial, plan=plan, workdir=launch_plan.workdir if launch_plan else None),
    )


def _environment_config(*, plan: dict[str, Any], access: ModelAccess | None = None) -> Any:
    """Harbor's environment for the plan. With model access (the local sandbox only, see
    apps.trials.model_access): the bridge to the proxy's socket and Claude Code on PATH."""
    from harbor.models.trial.config import EnvironmentConfig

    overrides = plan.get("resources") or {}
    common: dict[str, Any] = {
        "override_cpus": overrides.get("cpus"),
        "override_memory_mb": overrides.get("memory_mb"),
        "override_storage_mb": overrides.get("storage_mb"),
        "delete": True,
    }
    if access is not None:
        kwargs, env = sandbox_model_options(access=access)
        common.update(kwargs=kwargs, env=env)
    import_path = environment_import_path(plan=plan)
    if import_path is not None:
        return EnvironmentConfig(import_path=import_path, **common)
    return EnvironmentConfig(type=plan["environment"], **common)  # docker, daytona, modal, e2b, gke, ...


def _verifier_config(*, trial: Trial, judge_plan: Any) -> Any:
    from harbor.models.trial.config import VerifierConfig

    from apps.trials.judges import IMPORT_PATH as JUDGE_VERIFIER
    from synth_launcher.harbor_agent import CREDENTIAL_ENV

    plan = trial.run.spec.plan
    if judge_plan is None:
        return VerifierConfig(
            disable=trial.run.kind == RunKind.EXECUTE, override_timeout_sec=plan.get("verifier_timeout_sec")
        )
    return VerifierConfig(
        import_path=JUDGE_VERIFIER,
        kwargs={"launch_plan": judge_plan.to_dict()},
        # Harbor's persisted config redacts env values; kwargs would be stored in clear.
        env={CREDENTIAL_ENV: judge_plan.credential} if judge_plan.credential else {},
        # The judge's own deadline (its recipe's limit and setup), not the tests'.
        override_timeout_sec=plan.get("verifier_timeout_sec")
        or judge_plan.timeout_sec + judge_plan.setup_timeout_sec * len(judge_plan.setup) + 60,
    )


def _artifacts(*, trial: Trial, plan: dict[str, Any], workdir: str | None) -> list[dict[str, Any]]:
    """What Harbor collects from the agent's environment. An unscored run's product is the
    work itself, a scored run keeps it to be regraded; a fresh verifier receives it whole
    (in a sandbox of its own, the workdir is the only thing the agent hands over)."""
    if workdir is None:
        return []
    if plan.get("verifier") == "fresh":
        return [{"source": workdir, "destination": "workdir"}]
    if trial.run.kind == RunKind.EXECUTE or plan.get("retain_workdir"):
        return [{"source": workdir, "destination": "workdir", "exclude": [".git", "__pycache__"]}]
    return []


def _sanitize_git(*, plan: dict[str, Any], task_dir: Path) -> bool:
    """The plan's setting, else the task's (task.toml ``[metadata] sanitize_git``)."""
    if plan.get("sanitize_git") is not None:
        return bool(plan["sanitize_git"])
    from harbor.models.task.config import TaskConfig
    from harbor.models.task.paths import TaskPaths

    # Its task.toml alone, as Harbor's Task reads it: a whole Task also walks and checks every
    # file of the task, which the launch plan's Task and Harbor's own do again.
    config = TaskConfig.model_validate_toml(TaskPaths(task_dir).config_path.read_text())
    return config.metadata.get("sanitize_git") is True
