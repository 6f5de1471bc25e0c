from __future__ import annotations

import json

from django.contrib import admin
from django.template.loader import render_to_string
from django.utils.html import format_html
from django.utils.safestring import SafeString

from apps.core.admin_charts import Series, line_chart_svg
from apps.core.admin_utils import ReadOnlyAdmin, admin_link, changelist_link
from apps.runs.admin import run_page_section
from apps.runs.models import Run, RunKind
from apps.training.admin_selectors import checkpoint_count, learning_curve
from apps.training.models import Checkpoint, LearningUpdate, Trainer

# The learning table on a run page lists the latest steps (the chart shows all of them).
STEPS_LISTED = 50


@run_page_section
def training_section(run: Run) -> SafeString | None:
    """A train run's learning: reward and loss by step, and its updates and checkpoints."""
    if run.kind != RunKind.TRAIN:
        return None
    curve = learning_curve(run=run)
    chart = line_chart_svg(
        series=[
            Series(name="reward", points=[(p.step, p.reward) for p in curve if p.reward is not None]),
            Series(name="loss", points=[(p.step, p.loss) for p in curve if p.loss is not None]),
        ]
    )
    trainer = Trainer.objects.filter(run=run).first()
    return SafeString(
        render_to_string(
            "admin/training/run_section.html",
            {
                "chart": chart,
                "curve": curve[-STEPS_LISTED:],
                "steps_hidden": max(0, len(curve) - STEPS_LISTED),
                "trainer": trainer,
                "updates_link": changelist_link(
                    model=LearningUpdate, label=f"learning updates ({len(curve)})", run__id__exact=run.id
                ),
                "checkpoints_link": changelist_link(
                    model=Checkpoint, label=f"checkpoints ({checkpoint_count(run=run)})", run__id__exact=run.id
                ),
            },
        )
    )


@admin.register(Trainer)
class TrainerAdmin(ReadOnlyAdmin):
    list_display = ["run", "backend", "route", "step", "status", "dataset_cursor", "updated_at"]
    list_filter = ["status", "backend"]
    search_fields = ["run__id", "route"]


@admin.register(LearningUpdate)
class LearningUpdateAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "run",
        "step",
        "status",
        "reward",
        "loss",
        "datums",
        "sampled_tokens",
        "checkpoint",
        "finished_at",
    ]
    list_filter = ["status"]
    search_fields = ["id", "run__id"]
    ordering = ["run", "step"]
    readonly_fields = ["run_link", "checkpoint_link", "metrics_pretty", "groups_pretty"]
    exclude = ["metrics", "groups"]

    @admin.display(description="mean reward")
    def reward(self, update: LearningUpdate) -> object:
        return update.metrics.get("reward_mean")

    @admin.display(description="loss")
    def loss(self, update: LearningUpdate) -> object:
        return update.metrics.get("loss_sum")

    @admin.display(description="run")
    def run_link(self, update: LearningUpdate) -> str:
        return admin_link(update.run)

    @admin.display(description="checkpoint")
    def checkpoint_link(self, update: LearningUpdate) -> str:
        return admin_link(update.checkpoint)

    @admin.display(description="metrics")
    def metrics_pretty(self, update: LearningUpdate) -> str:
        return format_html("<pre>{}</pre>", json.dumps(update.metrics, indent=2, sort_keys=True))

    @admin.display(description="groups")
    def groups_pretty(self, update: LearningUpdate) -> str:
        return format_html("<pre>{}</pre>", json.dumps(update.groups, indent=2, sort_keys=True))


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ["id", "org", "run", "step", "backend", "route", "lora_rank", "milestone", "created_at"]
    list_filter = ["backend", "milestone", "route"]
    search_fields = ["id", "run__id", "sha256"]
    readonly_fields = ["run_link", "parent_link", "update_link"]

    @admin.display(description="run")
    def run_link(self, checkpoint: Checkpoint) -> str:
        return admin_link(checkpoint.run)

    @admin.display(description="parent")
    def parent_link(self, checkpoint: Checkpoint) -> str:
        return admin_link(checkpoint.parent)

    @admin.display(description="made by")
    def update_link(self, checkpoint: Checkpoint) -> str:
        return admin_link(getattr(checkpoint, "update", None))
