from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from apps.core.admin_utils import ReadOnlyAdmin, ReadOnlyInline, admin_link
from apps.runs.models import (
    Artifact,
    Lease,
    LeaseWrite,
    Reservation,
    Run,
    RunEvent,
    RunSpec,
    SamplingGroup,
    Trial,
    WorkerNode,
)


class RunEventInline(ReadOnlyInline):
    model = RunEvent
    fields = ["seq", "type", "data", "created_at"]
    readonly_fields = fields
    ordering = ["-seq"]
    max_num = 0
    show_change_link = False

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).order_by("-seq")


class GroupInline(ReadOnlyInline):
    model = SamplingGroup
    fields = ["id", "step", "position", "task_version", "attempts", "status", "settled_at"]
    readonly_fields = fields


class LeaseInline(ReadOnlyInline):
    model = Lease
    fields = [
        "id",
        "unit",
        "worker",
        "fence",
        "status",
        "acquired_at",
        "heartbeat_at",
        "expires_at",
        "ended_at",
    ]
    readonly_fields = fields


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "org",
        "kind",
        "status",
        "dataset",
        "actor",
        "created_at",
        "finished_at",
    ]
    list_filter = ["status", "kind", "org", "created_at"]
    search_fields = [
        "id",
        "idempotency_key",
        "spec__dataset_ref",
        "spec__actor_version__profile__name",
    ]
    list_select_related = ["org", "spec", "spec__actor_version__profile"]
    readonly_fields = [
        "id",
        "org",
        "created_by",
        "kind",
        "idempotency_key",
        "request_digest",
        "last_event_seq",
        "spec_link",
        "summary_pretty",
        "created_at",
        "updated_at",
        "started_at",
        "finished_at",
        "cancel_requested_at",
        "error",
        "status",
    ]
    exclude = ["summary"]
    inlines = [GroupInline, LeaseInline, RunEventInline]
    actions = ["cancel_runs"]

    @admin.display(description="dataset")
    def dataset(self, run: Run) -> str:
        return run.spec.dataset_ref if hasattr(run, "spec") else "-"

    @admin.display(description="actor")
    def actor(self, run: Run) -> str:
        return str(run.spec.actor_version) if hasattr(run, "spec") else "-"

    @admin.display(description="spec")
    def spec_link(self, run: Run) -> str:
        return admin_link(getattr(run, "spec", None))

    @admin.display(description="summary")
    def summary_pretty(self, run: Run) -> str:
        return format_html("<pre>{}</pre>", json.dumps(run.summary, indent=2, sort_keys=True))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # runs are admitted through the API (idempotency, validation, pinning)

    @admin.action(description="Cancel selected runs")
    def cancel_runs(self, request: HttpRequest, queryset: Any) -> None:
        from apps.runs.services import run_cancel

        for run in queryset:
            run_cancel(
                org=run.org,
                run_id=run.id,
                reason=f"cancelled in admin by {request.user}",
            )


@admin.register(RunSpec)
class RunSpecAdmin(ReadOnlyAdmin):
    list_display = [
        "run",
        "dataset_ref",
        "actor_version",
        "judge_version",
        "created_at",
    ]
    search_fields = ["run__id", "dataset_ref"]
    readonly_fields = [
        "run_link",
        "dataset_version_link",
        "dataset_ref",
        "dataset_digest",
        "actor_version_link",
        "actor_digest",
        "judge_version",
        "judge_digest",
        "model_binding",
        "plan_pretty",
        "created_at",
    ]
    exclude = ["plan", "run", "dataset_version", "actor_version"]

    @admin.display(description="run")
    def run_link(self, spec: RunSpec) -> str:
        return admin_link(spec.run)

    @admin.display(description="dataset version")
    def dataset_version_link(self, spec: RunSpec) -> str:
        return admin_link(spec.dataset_version)

    @admin.display(description="actor version")
    def actor_version_link(self, spec: RunSpec) -> str:
        return admin_link(spec.actor_version)

    @admin.display(description="plan")
    def plan_pretty(self, spec: RunSpec) -> str:
        return format_html("<pre>{}</pre>", json.dumps(spec.plan, indent=2, sort_keys=True))


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):
    list_display = ["run", "seq", "type", "created_at"]
    list_filter = ["type"]
    search_fields = ["run__id", "type"]


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "run",
        "unit",
        "worker",
        "fence",
        "status",
        "heartbeat_at",
        "expires_at",
    ]
    list_filter = ["status", "worker"]
    search_fields = ["id", "run__id", "worker__name"]


@admin.register(LeaseWrite)
class LeaseWriteAdmin(ReadOnlyAdmin):
    list_display = ["lease", "local_seq", "created_at"]
    search_fields = ["lease__id"]


class TrialInline(ReadOnlyInline):
    model = Trial
    fields = ["id", "attempt", "status", "reward", "error_type", "worker_node", "started_at", "finished_at"]
    readonly_fields = fields


class ArtifactInline(ReadOnlyInline):
    model = Artifact
    fk_name = "trial"
    fields = ["name", "kind", "size", "sha256", "object"]
    readonly_fields = fields


@admin.register(SamplingGroup)
class SamplingGroupAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "step", "position", "task_version", "attempts", "status", "mean_reward"]
    list_filter = ["status"]
    search_fields = ["id", "run__id", "task_version__name"]
    inlines = [TrialInline]

    @admin.display(description="mean reward")
    def mean_reward(self, group: SamplingGroup) -> Any:
        return group.summary.get("mean_reward")


@admin.register(Trial)
class TrialAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "task", "attempt", "status", "reward", "error_type", "worker_node", "finished_at"]
    list_filter = ["status", "error_type", "worker_node"]
    search_fields = ["id", "run__id", "task_version__name", "error_message"]
    list_select_related = ["task_version"]
    inlines = [ArtifactInline]

    @admin.display(description="task")
    def task(self, trial: Trial) -> str:
        return trial.task_version.name


@admin.register(Artifact)
class ArtifactAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "trial", "name", "kind", "size", "sha256"]
    list_filter = ["kind"]
    search_fields = ["id", "run__id", "trial__id", "name", "sha256"]


class ReservationInline(ReadOnlyInline):
    model = Reservation
    fields = ["trial", "status", "cpus", "memory_mb", "storage_mb", "created_at", "granted_at"]
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).exclude(status="released")


@admin.register(WorkerNode)
class WorkerNodeAdmin(ReadOnlyAdmin):
    """Each trials worker's budget and what is reserved against it right now."""

    list_display = ["name", "slots", "cpus", "memory_mb", "storage_mb", "usage", "seen_at"]
    inlines = [ReservationInline]

    @admin.display(description="in use (slots / cpus / MB / waiting)")
    def usage(self, node: WorkerNode) -> str:
        from apps.trials.admission import node_usage

        u = node_usage(node=node)
        return f"{u['slots']} / {u['cpus']:g} / {u['memory_mb']} / {u['waiting']} waiting"


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdmin):
    list_display = ["id", "node", "trial", "status", "cpus", "memory_mb", "storage_mb", "created_at", "granted_at"]
    list_filter = ["status", "node"]
    search_fields = ["trial__id"]
