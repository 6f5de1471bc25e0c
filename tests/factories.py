"""Builders of pinned inputs (dataset versions, profile versions) straight from models,
so that runs tests do not depend on the import and publish paths tested elsewhere."""

from __future__ import annotations

from typing import Any

from apps.accounts.models import Organization
from apps.datasets.models import Dataset, DatasetVersion, DatasetVersionTask, TaskVersion
from apps.objects.services import object_put
from apps.profiles.models import AgentProfile, ProfileVersion
from synth_common.canonical import canonical_bytes, canonical_digest, sha256_hex

NOOP_RECIPE: dict[str, Any] = {"engine": {"name": "nop", "version": "1"}, "limits": {"timeout_sec": 60}}


def make_dataset_version(
    *, org: Organization, name: str = "evaluation", version: str = "v1", tasks: int = 2
) -> DatasetVersion:
    dataset, _ = Dataset.objects.get_or_create(org=org, name=name)
    digests = []
    task_versions = []
    for i in range(tasks):
        archive = object_put(org=org, data=f"{name}-{version}-task-{i}".encode())
        tv = TaskVersion.objects.create(
            org=org,
            name=f"examples/task-{i}",
            digest=archive.sha256,
            archive=archive,
            config={},
            instruction="do it",
            verifier_timeout_sec=60,
        )
        task_versions.append(tv)
        digests.append(tv.digest)
    dsv = DatasetVersion.objects.create(
        dataset=dataset, version=version, digest=canonical_digest(digests), task_count=tasks
    )
    for i, tv in enumerate(task_versions):
        DatasetVersionTask.objects.create(dataset_version=dsv, position=i, task_version=tv)
    return dsv


def make_profile_version(
    *, org: Organization, name: str = "noop", recipe: dict[str, Any] | None = None
) -> ProfileVersion:
    profile, _ = AgentProfile.objects.get_or_create(org=org, name=name)
    data = canonical_bytes(recipe or NOOP_RECIPE)
    version = (profile.versions.order_by("-version").values_list("version", flat=True).first() or 0) + 1
    return ProfileVersion.objects.create(profile=profile, version=version, canonical=data, digest=sha256_hex(data))


def make_task_version_unchecked(*, org: Organization, path: Any, name: str) -> TaskVersion:
    """A task version straight from a folder, skipping import validation: how a task that
    import would refuse (or one broken later) can still reach a worker in tests."""
    from pathlib import Path

    from harbor.models.task.task import strip_canary

    from apps.datasets.task_archives import canonical_tar, task_entries_collect

    data = canonical_tar(task_entries_collect(Path(path), label=name))
    # The instruction as import stores it for a task of one step (apps.datasets.harbor_tasks):
    # the launch hands the agent the stored one.
    instruction_md = Path(path) / "instruction.md"
    instruction = strip_canary(instruction_md.read_text()) if instruction_md.is_file() else ""
    archive = object_put(org=org, data=data)
    tv, _ = TaskVersion.objects.get_or_create(
        org=org,
        digest=archive.sha256,
        defaults={
            "name": name,
            "archive": archive,
            "config": {},
            "instruction": instruction,
            "verifier_timeout_sec": 60,
            "agent_timeout_sec": 30,
            "memory_mb": 512,
            "storage_mb": 256,
        },
    )
    return tv


def make_dataset_of(*, org: Organization, name: str, version: str, task_versions: list[TaskVersion]) -> DatasetVersion:
    dataset, _ = Dataset.objects.get_or_create(org=org, name=name)
    dsv = DatasetVersion.objects.create(
        dataset=dataset,
        version=version,
        digest=canonical_digest([t.digest for t in task_versions]),
        task_count=len(task_versions),
    )
    for i, tv in enumerate(task_versions):
        DatasetVersionTask.objects.create(dataset_version=dsv, position=i, task_version=tv)
    return dsv


TRAIN_RECIPE: dict[str, Any] = {"model": {"route": "qwen3-8b"}, "engine": {"name": "synth-mini", "version": "1"}}


def make_train_run(*, org: Organization, tasks: int = 3, **plan: Any) -> Any:
    """A train run admitted, scheduled and dispatched on the default route (no broker: the
    on-commit enqueues do not fire in these tests), with ``plan`` over two steps of 2x2."""
    from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
    from apps.runs.dispatch import run_dispatch
    from apps.runs.models import Run
    from apps.runs.services import run_schedule, run_submit

    route_upsert(**DEFAULT_ROUTE)
    profile = make_profile_version(org=org, name="mini", recipe=TRAIN_RECIPE)
    dataset = make_dataset_version(org=org, tasks=tasks)
    body = {
        "kind": "train",
        "dataset": dataset.reference,
        "actor": {"profile": profile.profile.name, "version": profile.version},
        "plan": {"steps": 2, "batch_size": 2, "group_size": 2, **plan},
    }
    run, _ = run_submit(org=org, user=None, idempotency_key="train", body=body)
    run_schedule(run_id=run.id)
    run_dispatch(run_id=run.id)
    return Run.objects.get(pk=run.pk)


def make_assessed_runs(
    *, org: Organization, original: list[float | None], regrades: list[list[float | None]]
) -> tuple[Any, list[Any]]:
    """An evaluate run whose trials kept their work and got ``original`` rewards, and one
    regrade of it per list in ``regrades`` (rewards in the same trial order). Returns
    (source run, regrade runs). The runs are moved along by hand: no worker, no broker."""
    from apps.runs.dispatch import run_dispatch
    from apps.runs.models import Artifact, Run, Trial
    from apps.runs.services import run_regrade, run_submit

    dataset = make_dataset_version(org=org, name="agreement", tasks=2)
    actor = make_profile_version(org=org, name="agreement-actor")
    judge = make_profile_version(org=org, name="agreement-judge")
    body = {
        "kind": "evaluate",
        "dataset": dataset.reference,
        "actor": {"profile": actor.profile.name, "version": actor.version},
        "plan": {"attempts_per_task": len(original) // 2},
    }

    def assess(run: Any, rewards: list[float | None]) -> list[Any]:
        Run.objects.filter(pk=run.pk).update(status="queued")
        run_dispatch(run_id=run.id)
        trials = list(Trial.objects.filter(run=run).order_by("source_id", "id"))
        assert len(trials) == len(rewards)
        for trial, reward in zip(trials, rewards, strict=True):
            Trial.objects.filter(pk=trial.pk).update(
                status="succeeded" if reward is not None else "failed",
                reward=reward,
                error_type="" if reward is not None else "VerifierError",
            )
        Run.objects.filter(pk=run.pk).update(status="succeeded")
        return trials

    source, _ = run_submit(org=org, user=None, idempotency_key="agreement-source", body=body)
    for trial in assess(source, original):
        work = object_put(org=org, data=f"work of {trial.id}".encode())
        Artifact.objects.create(
            run=source,
            trial=trial,
            name="artifacts/workdir/main.py",
            kind="work",
            object=work,
            sha256=work.sha256,
            size=work.size,
        )
    runs = []
    for i, rewards in enumerate(regrades):
        regrade, _ = run_regrade(
            org=org,
            user=None,
            run_id=source.id,
            idempotency_key=f"agreement-regrade-{i}",
            body={"judge": {"profile": judge.profile.name, "version": judge.version}},
        )
        assess(regrade, rewards)
        runs.append(regrade)
    return source, runs
