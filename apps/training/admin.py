from __future__ import annotations

from django.contrib import admin

from apps.core.admin_utils import ReadOnlyAdmin
from apps.training.models import Checkpoint, LearningUpdate, Trainer


@admin.register(Trainer)
class TrainerAdmin(ReadOnlyAdmin):
    list_display = ["run", "backend", "route", "step", "status", "dataset_cursor", "updated_at"]
    list_filter = ["status", "backend"]
    search_fields = ["run__id", "route"]


@admin.register(LearningUpdate)
class LearningUpdateAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "step", "status", "datums", "sampled_tokens", "checkpoint", "finished_at"]
    list_filter = ["status"]
    search_fields = ["id", "run__id"]


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ["id", "org", "run", "step", "backend", "route", "lora_rank", "milestone", "created_at"]
    list_filter = ["backend", "milestone", "route"]
    search_fields = ["id", "run__id", "sha256"]
