from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from apps.core.admin_utils import PagedInline, ReadOnlyAdmin, ReadOnlyInline, admin_link, changelist_link
from apps.objects.services import object_open
from apps.runs.admin_selectors import run_progress, run_task_table, trial_previews
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

# Sections other apps add to a run's page (training adds its learning curve): runs import
# no training, so the dependency points this way. Each returns HTML, or None to add nothing.
RunSection = Callable[[Run], SafeString | None]
RUN_PAGE_SECTIONS: list[RunSection] = []


def run_page_section(section: RunSection) -> RunSection:
    RUN_PAGE_SECTIONS.append(section)
    return section


class RunTrialInline(PagedInline):
    model = Trial
    fields = ["id", "task", "attempt", "status", "reward", "error_type", "worker_node", "finished_at"]
    readonly_fields = fields
    ordering = ["group__step", "group__position", "attempt"]

    @admin.display(description="task")
    def task(self, trial: Trial) -> str:
        return trial.task_version.name

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("task_version")


class GroupInline(PagedInline):
    model = SamplingGroup
    fields = ["id", "step", "position", "task_version", "attempts", "status", "settled_at"]
    readonly_fields = fields


class LeaseInline(PagedInline):
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
        "events_link",
        "created_at",
        "updated_at",
        "started_at",
        "finished_at",
        "cancel_requested_at",
        "error",
        "status",
    ]
    exclude = ["summary"]
    inlines = [RunTrialInline, GroupInline, LeaseInline]
    actions = ["cancel_runs"]
    change_form_template = "admin/runs/run/change_form.html"

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        run = self.get_object(request, object_id)
        if run is not None:
            extra_context = {**(extra_context or {}), "overview": self.overview(run)}
        return super().change_view(request, object_id, form_url, extra_context)

    def overview(self, run: Run) -> SafeString:
        """Status, progress, the per-task table and links, above the run's fields."""
        sections = [html for section in RUN_PAGE_SECTIONS if (html := section(run)) is not None]
        return SafeString(
            render_to_string(
                "admin/runs/run/overview.html",
                {
                    "run": run,
                    "progress": run_progress(run=run),
                    "tasks": run_task_table(run=run),
                    "links": self.links(run),
                    "sections": sections,
                },
            )
        )

    def links(self, run: Run) -> SafeString:
        items = [
            changelist_link(model=Trial, label="trials", run__id__exact=run.id),
            changelist_link(model=SamplingGroup, label="groups", run__id__exact=run.id),
            changelist_link(model=RunEvent, label=f"events ({run.last_event_seq})", run__id__exact=run.id),
            changelist_link(model=Artifact, label="artifacts", run__id__exact=run.id),
            changelist_link(model=Lease, label="leases", run__id__exact=run.id),
            format_html(
                '<a href="{}?run_id={}">model calls</a>', reverse("admin:proxy_interaction_changelist"), run.id
            ),
        ]
        return format_html_join(" · ", "{}", ((item,) for item in items))

    @admin.display(description="events")
    def events_link(self, run: Run) -> str:
        return changelist_link(model=RunEvent, label=f"{run.last_event_seq} events", run__id__exact=run.id)

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
        "actors",
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
    ordering = ["run", "-seq"]
    list_per_page = 50
    readonly_fields = ["run", "seq", "type", "data_pretty", "created_at"]
    exclude = ["data"]

    @admin.display(description="data")
    def data_pretty(self, event: RunEvent) -> str:
        return format_html("<pre>{}</pre>", json.dumps(event.data, indent=2, sort_keys=True))


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


class TrialInline(PagedInline):
    model = Trial
    fields = ["id", "attempt", "status", "reward", "error_type", "worker_node", "started_at", "finished_at"]
    readonly_fields = fields


class ArtifactInline(PagedInline):
    model = Artifact
    fk_name = "trial"
    fields = ["name", "kind", "size", "sha256", "download"]
    readonly_fields = fields

    @admin.display(description="download")
    def download(self, artifact: Artifact) -> str:
        return download_link(artifact)


def download_link(artifact: Artifact) -> str:
    return format_html('<a href="{}">download</a>', reverse("admin:runs_artifact_download", args=[artifact.pk]))


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
    readonly_fields = ["run_link", "group_link", "task", "calls_link", "logs"]

    @admin.display(description="task")
    def task(self, trial: Trial) -> str:
        return trial.task_version.name

    @admin.display(description="run")
    def run_link(self, trial: Trial) -> str:
        return admin_link(trial.run)

    @admin.display(description="group")
    def group_link(self, trial: Trial) -> str:
        return admin_link(trial.group)

    @admin.display(description="model calls")
    def calls_link(self, trial: Trial) -> str:
        url = reverse("admin:proxy_interaction_changelist")
        return format_html('<a href="{}?trial_id={}">model calls of this attempt</a>', url, trial.id)

    @admin.display(description="logs and artifacts")
    def logs(self, trial: Trial) -> str:
        shown, rest = trial_previews(trial=trial)
        return render_to_string(
            "admin/runs/trial/logs.html",
            {
                "previews": [(p, download_link(p.artifact)) for p in shown],
                "rest": [(a, download_link(a)) for a in rest],
            },
        )


@admin.register(Artifact)
class ArtifactAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "trial", "name", "kind", "size", "sha256"]
    list_filter = ["kind"]
    search_fields = ["id", "run__id", "trial__id", "name", "sha256"]

    def get_urls(self) -> list[URLPattern]:
        download = path(
            "<path:object_id>/download/",
            self.admin_site.admin_view(self.download_view),
            name="runs_artifact_download",
        )
        return [download, *super().get_urls()]

    def download_view(self, request: HttpRequest, object_id: str) -> FileResponse:
        if not self.has_view_permission(request):
            raise Http404
        artifact = get_object_or_404(Artifact.objects.select_related("object"), pk=object_id)
        return FileResponse(
            object_open(obj=artifact.object),
            as_attachment=True,
            filename=artifact.name.rsplit("/", 1)[-1],
            content_type=artifact.object.content_type,
        )


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
