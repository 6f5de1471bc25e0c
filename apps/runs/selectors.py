"""Reads for runs; every one is scoped by organization."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import QuerySet

from apps.accounts.models import Organization
from apps.core.errors import NotFound
from apps.runs.models import Run, RunEvent


def run_list(
    *, org: Organization, status: Sequence[str] | None = None, kind: Sequence[str] | None = None
) -> QuerySet[Run]:
    qs = Run.objects.filter(org=org).select_related(
        "spec", "spec__actor_version__profile", "spec__judge_version__profile"
    )
    if status:
        qs = qs.filter(status__in=status)
    if kind:
        qs = qs.filter(kind__in=kind)
    return qs


def run_get(*, org: Organization, run_id: str) -> Run:
    run = run_list(org=org).filter(pk=run_id).first()
    if run is None:
        # Another organization's run is indistinguishable from a missing one.
        raise NotFound(f"run {run_id} not found")
    return run


def run_events_after(*, run: Run, after: int, limit: int) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run=run, seq__gt=after).order_by("seq")[:limit])


def group_list(*, run: Run, step: int | None = None, status: Sequence[str] | None = None) -> QuerySet:
    from apps.runs.models import SamplingGroup

    qs = SamplingGroup.objects.filter(run=run).select_related("task_version", "actor__profile")
    if step is not None:
        qs = qs.filter(step=step)
    if status:
        qs = qs.filter(status__in=status)
    return qs


def trial_list(*, run: Run, status: Sequence[str] | None = None) -> QuerySet:
    from apps.runs.models import Trial

    qs = Trial.objects.filter(run=run).select_related("task_version")
    if status:
        qs = qs.filter(status__in=status)
    return qs


def trial_get(*, org: Organization, trial_id: str) -> Any:
    from apps.runs.models import Trial

    trial = Trial.objects.filter(run__org=org, pk=trial_id).select_related("task_version").first()
    if trial is None:
        # Another organization's trial is indistinguishable from a missing one.
        raise NotFound(f"trial {trial_id} not found")
    return trial


def artifact_list(*, run: Run, trial_id: str | None = None) -> QuerySet:
    from apps.runs.models import Artifact

    qs = Artifact.objects.filter(run=run)
    if trial_id:
        qs = qs.filter(trial_id=trial_id)
    return qs
