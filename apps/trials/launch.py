"""What an attempt launches: the actor's launch plan, the judge's, or a regrade's restore agent.

The recipes are the run's pinned profile versions; the one launcher (synth_launcher.launcher)
interprets a recipe with the attempt's bindings (task, run, attempt, model access) into a
launch plan. A regrade launches no actor: its "agent" puts the source attempt's retained
workdir back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from apps.runs.models import Artifact, Trial
from apps.trials.model_access import ModelAccess


def actor_recipe(*, trial: Trial) -> dict[str, Any]:
    from apps.profiles.selectors import profile_version_recipe

    # A mixed run's group names its actor; otherwise the run's one actor.
    actor = trial.group.actor or trial.run.spec.actor_version
    return profile_version_recipe(profile_version=actor)


def judge_recipe(*, trial: Trial) -> dict[str, Any] | None:
    from apps.profiles.selectors import profile_version_recipe

    judge = trial.run.spec.judge_version
    return profile_version_recipe(profile_version=judge) if judge is not None else None


def judge_binding(*, trial: Trial) -> dict[str, Any]:
    """The judge's own model binding, as pinned at admission."""
    return dict(trial.run.spec.judge_binding or {})


# A regrade restores the retained workdir's files this many (or this many bytes) at a time:
# read together from the object store, then written.
RESTORE_BATCH = 64
RESTORE_BATCH_BYTES = 64 * 1024 * 1024


def _restore_batches(files: list[tuple[Path, Any]]) -> list[list[tuple[Path, Any]]]:
    """``files`` (path, stored object) in batches of at most RESTORE_BATCH files and, unless
    one file alone is bigger, RESTORE_BATCH_BYTES bytes."""
    batches: list[list[tuple[Path, Any]]] = []
    size = 0
    for item in files:
        if not batches or len(batches[-1]) >= RESTORE_BATCH or size + item[1].size > RESTORE_BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(item)
        size += item[1].size
    return batches


def restore_agent_config(*, trial: Trial, task_dir: Path, dest: Path) -> tuple[Any, str]:
    """The regrade's agent, which puts the source attempt's retained workdir back where the
    source's launch plan had it (AgentConfig, that workdir). The files are read from the
    object store a batch at a time, in parallel: a workdir holds hundreds of them."""
    from harbor.models.trial.config import AgentConfig

    from apps.objects.services import object_read, objects_read
    from synth_sandbox.support import task_workdir

    prefix = "artifacts/workdir/"
    workdir = task_workdir(task_dir=task_dir)
    dest.mkdir(parents=True, exist_ok=True)
    files: list[tuple[Path, Any]] = []
    for artifact in Artifact.objects.filter(trial_id=trial.source_id).select_related("object"):
        if artifact.name == "launch-plan.json":
            workdir = json.loads(object_read(obj=artifact.object)).get("workdir") or workdir
        if artifact.kind != "work":
            continue
        relative = Path(artifact.name.removeprefix(prefix))
        if relative.is_absolute() or ".." in relative.parts:
            raise ValueError(f"artifact {artifact.id} has an unsafe name {artifact.name!r}")
        files.append((relative, artifact.object))
    for batch in _restore_batches(files):
        data = objects_read(objs=[obj for _, obj in batch])
        for relative, obj in batch:
            (dest / relative).parent.mkdir(parents=True, exist_ok=True)
            (dest / relative).write_bytes(data[obj.sha256])
    config = AgentConfig(
        import_path="synth_launcher.harbor_agent:RestoreAgent",
        kwargs={"source_dir": str(dest), "workdir": workdir, "source_trial": trial.source_id},
    )
    return config, workdir


def trial_launch_plan(
    *,
    trial: Trial,
    task_dir: Path,
    recipe: dict[str, Any] | None = None,
    access: ModelAccess | None = None,
    instruction: str | None = None,
    logs_dir: str | None = None,
) -> Any:
    """The recipe interpreted for this attempt, by the one launcher (synth_launcher.launcher).

    ``access`` (apps.trials.model_access) is the attempt's model: the binding the harness sees
    (the bridge's address inside the sandbox) and the scoped credential. Without it, an
    engine that needs a model fails to launch with a clear LaunchError.
    """
    from synth_launcher.launcher import (
        AGENT_LOGS_DIR,
        AttemptBinding,
        Bindings,
        RunBinding,
        TaskBinding,
        launch_plan_build,
    )
    from synth_sandbox.support import task_workdir

    if recipe is None:
        recipe = actor_recipe(trial=trial)
    tv = trial.task_version
    bindings = Bindings(
        task=TaskBinding(
            name=tv.name,
            workdir=task_workdir(task_dir=task_dir),  # the sandbox's cwd: task.toml, else the Dockerfile's WORKDIR
            # Stored at import from the same verified package (apps.datasets.harbor_tasks, as
            # Harbor reads it): building Harbor's Task here only to read it parsed task.toml and
            # checked the task's files once more per launch plan (2-3 ms each, two per judged trial).
            instruction=instruction if instruction is not None else tv.instruction,
            agent_timeout_sec=tv.agent_timeout_sec,
            id=tv.id,
            digest=tv.digest,
        ),
        run=RunBinding(id=trial.run_id, kind=trial.run.kind),
        attempt=AttemptBinding(trial_id=trial.id, index=trial.attempt, group_id=trial.group_id),
        model=access.binding if access is not None else None,
        credential=access.secret if access is not None else None,
        proxy_address=f"unix:{access.socket}" if access is not None else None,
    )
    return launch_plan_build(recipe=recipe, bindings=bindings, logs_dir=logs_dir or AGENT_LOGS_DIR)
