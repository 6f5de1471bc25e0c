"""Reads of task and dataset versions; every query is scoped by organization."""

from __future__ import annotations

from django.db.models import Exists, OuterRef, QuerySet

from apps.accounts.models import Organization
from apps.datasets.models import DatasetVersion, DatasetVersionTask, TaskVersion


def dataset_version_list(*, org: Organization) -> QuerySet[DatasetVersion]:
    return DatasetVersion.objects.filter(dataset__org=org).select_related("dataset", "dataset__org")


def dataset_version_get(
    *, org: Organization, name: str, version: str, with_local_support: bool = False
) -> DatasetVersion | None:
    """``with_local_support``: the version also carries ``has_local_unsupported`` (whether a
    task of it cannot run in the local sandbox), read in the same query, so that a
    submission's local check reads the entries only when there is something to report."""
    qs = dataset_version_list(org=org).filter(dataset__name=name, version=version)
    if with_local_support:
        qs = qs.annotate(
            has_local_unsupported=Exists(
                DatasetVersionTask.objects.filter(
                    dataset_version=OuterRef("pk"), task_version__local_support__supported=False
                )
            )
        )
    return next(iter(qs[:1]), None)  # unique (dataset, version): no ORDER BY to compile


def dataset_version_entries(
    *, dataset_version: DatasetVersion, start: int = 0, limit: int | None = None
) -> list[DatasetVersionTask]:
    """Entries in dataset order from position `start` (the cursor), at most `limit`."""
    qs = (
        DatasetVersionTask.objects.filter(dataset_version=dataset_version, position__gte=start)
        .select_related("task_version")
        .order_by("position")
    )
    return list(qs[:limit] if limit is not None else qs)


def dataset_version_task_versions(*, dataset_version: DatasetVersion) -> list[TaskVersion]:
    """The task versions of a dataset version, in order (a task may appear twice)."""
    return [entry.task_version for entry in dataset_version_entries(dataset_version=dataset_version)]


def _local_unsupported(*, dataset_version: DatasetVersion) -> QuerySet[DatasetVersionTask]:
    return DatasetVersionTask.objects.filter(
        dataset_version=dataset_version, task_version__local_support__supported=False
    )


def dataset_version_local_unsupported(
    *, dataset_version: DatasetVersion, limit: int | None = None
) -> list[DatasetVersionTask]:
    """Entries whose task the local sandbox cannot run (verdict stored at import), in order."""
    qs = _local_unsupported(dataset_version=dataset_version).select_related("task_version").order_by("position")
    return list(qs[:limit] if limit is not None else qs)


def dataset_version_local_unsupported_count(*, dataset_version: DatasetVersion) -> int:
    return _local_unsupported(dataset_version=dataset_version).count()


def task_version_get(*, org: Organization, task_version_id: str) -> TaskVersion | None:
    return TaskVersion.objects.filter(org=org, id=task_version_id).select_related("archive").first()


def task_version_list(*, org: Organization) -> QuerySet[TaskVersion]:
    return TaskVersion.objects.filter(org=org)
