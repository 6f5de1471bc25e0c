"""Reads of training state, scoped by organization."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from apps.accounts.models import Organization
from apps.core.errors import NotFound
from apps.runs.models import Run, RunSpec, SamplingGroup
from apps.training.models import Checkpoint, LearningUpdate


def run_updates(*, run: Run) -> QuerySet[LearningUpdate]:
    """A run's learning updates (the caller fetched the run within its organization)."""
    return LearningUpdate.objects.filter(run=run).select_related("checkpoint")


def run_checkpoints(*, run: Run) -> QuerySet[Checkpoint]:
    return Checkpoint.objects.filter(run=run)


def checkpoint_step(*, checkpoint: Checkpoint) -> int:
    """The step (from 0) whose update saved ``checkpoint``: the number every API answer
    gives it, as it gives updates and sampling groups. What is stored is the number of
    updates in its weights, one more."""
    return checkpoint.step - 1


def checkpoint_list(*, org: Organization, run_id: str | None = None) -> QuerySet[Checkpoint]:
    qs = Checkpoint.objects.filter(org=org)
    return qs.filter(run_id=run_id) if run_id else qs


def checkpoint_get(*, org: Organization, checkpoint_id: str) -> Checkpoint:
    checkpoint = Checkpoint.objects.filter(org=org, pk=checkpoint_id).select_related("parent").first()
    if checkpoint is None:
        raise NotFound(f"checkpoint {checkpoint_id} not found")
    return checkpoint


def checkpoint_lineage(*, checkpoint: Checkpoint) -> dict[str, Any]:
    """Where a checkpoint came from and where it went: its producing run and update, its
    ancestors, the runs whose spec selected it, and the groups sampled against it."""
    ancestors = []
    parent = checkpoint.parent
    while parent is not None:
        ancestors.append({"id": parent.id, "run": parent.run_id, "step": checkpoint_step(checkpoint=parent)})
        parent = parent.parent
    selected_by = list(
        RunSpec.objects.filter(run__org=checkpoint.org_id, model_binding__checkpoint=checkpoint.id)
        .order_by("run_id")
        .values_list("run_id", flat=True)
    )
    groups = list(
        SamplingGroup.objects.filter(run__org=checkpoint.org_id, sampler__checkpoint=checkpoint.id)
        .order_by("id")
        .values("id", "run_id", "step")
    )
    update = LearningUpdate.objects.filter(checkpoint=checkpoint).values_list("id", flat=True).first()
    return {
        "produced_by": {"run": checkpoint.run_id, "step": checkpoint_step(checkpoint=checkpoint), "update": update},
        "ancestors": ancestors,
        "selected_by_runs": selected_by,
        "sampled_groups": [{"id": g["id"], "run": g["run_id"], "step": g["step"]} for g in groups],
    }


def checkpoint_binding_resolve(*, org: Organization, checkpoint_id: str) -> dict[str, str] | None:
    """The model binding of one of ``org``'s checkpoints, or None (SYNTH_CHECKPOINT_RESOLVER)."""
    checkpoint = Checkpoint.objects.filter(org=org, pk=checkpoint_id).first()
    return checkpoint.binding() if checkpoint is not None else None
