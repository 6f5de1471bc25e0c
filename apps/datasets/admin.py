"""Operators browse task and dataset versions here; none of them can be edited.

Task versions, dataset versions and their entries are immutable (DB triggers refuse
UPDATE); datasets are only created by imports. So every admin is read-only.
"""

from __future__ import annotations

import json

from django.contrib import admin
from django.urls import NoReverseMatch
from django.utils.html import format_html

from apps.core.admin_utils import ReadOnlyAdmin, ReadOnlyInline, admin_link
from apps.datasets.models import Dataset, DatasetVersion, DatasetVersionTask, TaskVersion


def _pretty_json(value: object) -> str:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True))


class DatasetVersionTaskInline(ReadOnlyInline):
    model = DatasetVersionTask
    fields = ["position", "task_version_link", "task_name", "task_digest"]
    readonly_fields = fields
    ordering = ["position"]
    max_num = 0
    show_change_link = False

    def get_queryset(self, request):  # type: ignore[no-untyped-def]
        return super().get_queryset(request).select_related("task_version").order_by("position")

    @admin.display(description="task version")
    def task_version_link(self, entry: DatasetVersionTask) -> str:
        return admin_link(entry.task_version, entry.task_version_id)

    @admin.display(description="name")
    def task_name(self, entry: DatasetVersionTask) -> str:
        return entry.task_version.name

    @admin.display(description="digest")
    def task_digest(self, entry: DatasetVersionTask) -> str:
        return entry.task_version.digest


class DatasetVersionInline(ReadOnlyInline):
    model = DatasetVersion
    fields = ["id", "version", "digest", "task_count", "created_at"]
    readonly_fields = fields
    ordering = ["-created_at"]
    max_num = 0


@admin.register(Dataset)
class DatasetAdmin(ReadOnlyAdmin):
    list_display = ["id", "org", "name", "version_count", "created_at"]
    list_filter = ["org"]
    search_fields = ["id", "name", "org__slug"]
    list_select_related = ["org"]
    readonly_fields = ["id", "org", "name", "created_at"]
    inlines = [DatasetVersionInline]

    @admin.display(description="versions")
    def version_count(self, dataset: Dataset) -> int:
        return dataset.versions.count()


@admin.register(DatasetVersion)
class DatasetVersionAdmin(ReadOnlyAdmin):
    list_display = ["id", "reference", "dataset_org", "task_count", "short_digest", "created_at"]
    list_filter = ["dataset__org", "created_at"]
    search_fields = ["id", "dataset__name", "version", "digest", "dataset__org__slug"]
    list_select_related = ["dataset", "dataset__org"]
    readonly_fields = ["id", "reference", "dataset_link", "version", "digest", "task_count", "created_at"]
    exclude = ["dataset"]
    inlines = [DatasetVersionTaskInline]

    @admin.display(description="org", ordering="dataset__org__slug")
    def dataset_org(self, dv: DatasetVersion) -> str:
        return dv.dataset.org.slug

    @admin.display(description="digest")
    def short_digest(self, dv: DatasetVersion) -> str:
        return dv.digest[:12]

    @admin.display(description="dataset")
    def dataset_link(self, dv: DatasetVersion) -> str:
        return admin_link(dv.dataset)


@admin.register(TaskVersion)
class TaskVersionAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "name",
        "org",
        "short_digest",
        "cpus",
        "memory_mb",
        "agent_timeout_sec",
        "verifier_timeout_sec",
        "has_dockerfile",
        "has_solution",
        "created_at",
    ]
    list_filter = ["org", "has_dockerfile", "has_solution", "created_at"]
    search_fields = ["id", "name", "digest"]
    list_select_related = ["org"]
    readonly_fields = [
        "id",
        "org",
        "name",
        "digest",
        "archive_link",
        "agent_timeout_sec",
        "verifier_timeout_sec",
        "cpus",
        "memory_mb",
        "storage_mb",
        "docker_image",
        "has_dockerfile",
        "has_solution",
        "created_at",
        "config_pretty",
        "instruction_pre",
        "datasets",
    ]
    exclude = ["config", "instruction", "archive"]

    @admin.display(description="digest")
    def short_digest(self, tv: TaskVersion) -> str:
        return tv.digest[:12]

    @admin.display(description="archive")
    def archive_link(self, tv: TaskVersion) -> str:
        label = f"{tv.archive.key} ({tv.archive.size} B)"
        try:
            return admin_link(tv.archive, label)
        except NoReverseMatch:  # the objects app may not register an admin
            return label

    @admin.display(description="config (TaskConfig)")
    def config_pretty(self, tv: TaskVersion) -> str:
        return _pretty_json(tv.config)

    @admin.display(description="instruction")
    def instruction_pre(self, tv: TaskVersion) -> str:
        return format_html("<pre style='white-space: pre-wrap'>{}</pre>", tv.instruction)

    @admin.display(description="in dataset versions")
    def datasets(self, tv: TaskVersion) -> str:
        entries = tv.dataset_entries.select_related("dataset_version__dataset__org").order_by("-dataset_version_id")[
            :50
        ]
        links = [admin_link(e.dataset_version, f"{e.dataset_version.reference} #{e.position}") for e in entries]
        return format_html("<br>".join(["{}"] * len(links)), *links) if links else "-"


@admin.register(DatasetVersionTask)
class DatasetVersionTaskAdmin(ReadOnlyAdmin):
    list_display = ["id", "dataset_version_link", "position", "task_version_link"]
    list_filter = ["dataset_version__dataset__org"]
    search_fields = ["dataset_version__id", "task_version__id", "task_version__name"]
    list_select_related = ["dataset_version__dataset__org", "task_version"]
    readonly_fields = ["dataset_version_link", "position", "task_version_link"]
    exclude = ["dataset_version", "task_version"]

    @admin.display(description="dataset version")
    def dataset_version_link(self, entry: DatasetVersionTask) -> str:
        return admin_link(entry.dataset_version)

    @admin.display(description="task version")
    def task_version_link(self, entry: DatasetVersionTask) -> str:
        return admin_link(entry.task_version)
