"""Training listens to execution: a started train run, settled groups (enqueue only), and
the sweeper's tick (re-drives of the learner's own stuck work)."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from apps.runs import signals


@receiver(signals.train_run_started, dispatch_uid="training.train_run_started")
def on_train_run_started(*, run_id: str, **_: Any) -> None:
    from apps.training.tasks import training_start_task

    training_start_task.delay(run_id)


@receiver(signals.group_settled, dispatch_uid="training.group_settled")
def on_group_settled(*, run_id: str, step: int, group_id: str, kind: str | None = None, **_: Any) -> None:
    from apps.runs.models import Run, RunKind

    # Evaluation and execution groups settle too; only train runs have a learner.
    if kind is None:
        kind = Run.objects.filter(pk=run_id).values_list("kind", flat=True).first()
    if kind == RunKind.TRAIN:
        from apps.training.tasks import contribution_prepare_task, group_settled_task

        # Its contribution is prepared on the evidence queue while the training worker
        # feeds the groups before it; the feed records it itself if it comes first.
        contribution_prepare_task.delay(run_id, group_id)
        group_settled_task.delay(run_id, step)


@receiver(signals.sweep_tick, dispatch_uid="training.sweep_tick")
def on_sweep_tick(*, now: Any, limit: int, **_: Any) -> dict[str, int]:
    from apps.training.sweeper import training_sweep

    return training_sweep(now=now, limit=limit)
