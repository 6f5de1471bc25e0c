"""Reads behind the run and trial admin pages: progress, the per-task table, artifact text.

The admin is for staff across organizations (it is not org-scoped); the API's selectors are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count

from apps.objects.services import object_open
from apps.runs.evaluation import group_summarize
from apps.runs.models import TRIAL_TERMINAL, Artifact, Run, RunKind, Trial, TrialStatus

# At most this much of one artifact is shown on a trial's page (the rest is a download).
ARTIFACT_PREVIEW_BYTES = 64 * 1024
# Artifacts previewed on one trial page; the others are listed with their download links.
ARTIFACT_PREVIEWS = 8


@dataclass(frozen=True)
class Progress:
    total: int
    done: int
    by_status: dict[str, int]

    @property
    def percent(self) -> int:
        return int(100 * self.done / self.total) if self.total else 0


def run_progress(*, run: Run) -> Progress:
    """Trials done out of all the run has so far (a train run adds groups step by step)."""
    rows = Trial.objects.filter(run=run).values("status").annotate(n=Count("id")).order_by()
    counts = {r["status"]: r["n"] for r in rows}
    return Progress(
        total=sum(counts.values()),
        done=sum(n for status, n in counts.items() if status in TRIAL_TERMINAL),
        # In the lifecycle's order (pending first), not the database's.
        by_status={s.value: counts[s.value] for s in TrialStatus if counts.get(s.value)},
    )


def run_task_table(*, run: Run) -> list[dict[str, Any]]:
    """One row per task: attempts, mean reward, pass@k and errors, over the run's trials so
    far (all steps of a train run). Execute runs have no rewards: their rows show errors only."""
    trials = list(
        Trial.objects.filter(run=run)
        .select_related("task_version")
        .only("id", "group_id", "status", "reward", "error_type", "task_version__name")
        .order_by("task_version__name", "attempt")
    )
    by_task: dict[str, list[Trial]] = {}
    for trial in trials:
        by_task.setdefault(trial.task_version.name, []).append(trial)
    rows = []
    for name, task_trials in by_task.items():
        summary = group_summarize(trials=task_trials)
        rows.append(
            {
                "task": name,
                "attempts": summary["attempts"],
                "done": sum(1 for t in task_trials if t.status in TRIAL_TERMINAL),
                "scored": run.kind != RunKind.EXECUTE,
                "mean_reward": summary["mean_reward"],
                "pass_at_k": summary["pass_at_k"],
                "errors": summary["errors"],
            }
        )
    return rows


@dataclass(frozen=True)
class Preview:
    artifact: Artifact
    text: str | None  # None: binary, or not read
    truncated: bool
    error: str = ""


def artifact_preview(*, artifact: Artifact, limit: int = ARTIFACT_PREVIEW_BYTES) -> Preview:
    """The start of an artifact as text (UTF-8), bounded; binary content is not shown."""
    try:
        with object_open(obj=artifact.object) as stream:
            data = stream.read(limit + 1)
    except Exception as exc:  # noqa: BLE001 - a missing object must not break the page
        return Preview(artifact=artifact, text=None, truncated=False, error=f"cannot read: {exc}")
    truncated = len(data) > limit
    data = data[:limit]
    if b"\0" in data:
        return Preview(artifact=artifact, text=None, truncated=truncated)
    return Preview(artifact=artifact, text=data.decode("utf-8", errors="replace"), truncated=truncated)


def trial_previews(*, trial: Trial) -> tuple[list[Preview], list[Artifact]]:
    """Previews of a trial's first artifacts (by name), and the rest unread."""
    artifacts = list(trial.artifacts.select_related("object").order_by("name"))
    shown = [artifact_preview(artifact=a) for a in artifacts[:ARTIFACT_PREVIEWS]]
    return shown, artifacts[ARTIFACT_PREVIEWS:]
