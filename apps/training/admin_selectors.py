"""Reads behind the training parts of the admin: a train run's learning curve."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apps.runs.models import Run
from apps.training.models import Checkpoint, LearningUpdate


@dataclass(frozen=True)
class CurvePoint:
    step: int
    status: str
    reward: float | None
    loss: float | None
    checkpoint_id: str | None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def learning_curve(*, run: Run) -> list[CurvePoint]:
    """Per learning update, in step order: the batch's mean reward and the optimizer step's
    loss (a skipped step has a reward but no loss)."""
    updates = LearningUpdate.objects.filter(run=run).order_by("step").only("step", "status", "metrics", "checkpoint")
    return [
        CurvePoint(
            step=u.step,
            status=u.status,
            reward=_number(u.metrics.get("reward_mean")),
            loss=_number(u.metrics.get("loss_sum")),
            checkpoint_id=u.checkpoint_id,
        )
        for u in updates
    ]


def checkpoint_count(*, run: Run) -> int:
    return Checkpoint.objects.filter(run=run).count()
