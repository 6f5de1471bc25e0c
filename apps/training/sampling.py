"""Dynamic sampling: which tasks a step samples beyond its batch, and which attempts count.

``plan.dynamic_sampling: {"max_refills": N}``: a settled group without learning signal (too
few usable attempts, or all their rewards equal) is replaced at once by a group drawn from
the dataset cursor, in the same step and against the same sampler, up to N extra groups per
step, so that the step has ``batch_size`` useful groups where the dataset allows. Each
replacement is a ``GroupReplacement`` row (lineage) and a ``training.group_replaced`` event;
the replaced group stays in the step and the learner records it as skipped.

``plan.exclude_truncated``: an attempt with a response cut at ``max_tokens`` is left out
of its group (its reward was earned by a cut-off answer); the learner records why
(``apps.training.evidence``) and this module does not count it as usable.

The signal judged here is from the trials' rewards (and the captured stop reasons), before
any evidence is read: the learner's own qualification can only remove attempts, so a group
without signal here has none there either.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any

from apps.datasets.models import TaskVersion
from apps.proxy.models import Interaction
from apps.runs.dispatch import batch_extend
from apps.runs.events import event_append
from apps.runs.models import GroupStatus, Run, SamplingGroup, Trial, TrialStatus
from apps.training.models import GroupReplacement, Trainer

TRUNCATED = "a response was cut at max_tokens (plan.exclude_truncated)"
TRUNCATED_STOP = "max_tokens"


def train_entries(*, run: Run) -> list[tuple[int, TaskVersion]]:
    """The tasks a train run walks, in dataset order, after ``plan.task_names``."""
    patterns = run.spec.plan.get("task_names") or []
    return [
        (entry.position, entry.task_version)
        for entry in run.spec.dataset_version.entries.select_related("task_version").order_by("position")
        if not patterns or any(fnmatch.fnmatchcase(entry.task_version.name, p) for p in patterns)
    ]


def truncated_trials(*, run: Run, trial_ids: list[str]) -> set[str]:
    """The trials among ``trial_ids`` with an actor call that stopped at max_tokens."""
    return set(
        Interaction.objects.filter(
            org_id=run.org_id, run_id=run.id, trial_id__in=trial_ids, role="actor", stop_reason=TRUNCATED_STOP
        ).values_list("trial_id", flat=True)
    )


def signal_problem(*, rewards: list[float], plan: dict[str, Any]) -> str:
    """Why a group's usable rewards give no learning signal ("" if they give one)."""
    min_valid = int((plan.get("eligibility") or {}).get("min_valid_per_group", 2))
    if len(rewards) < min_valid:
        return f"{len(rewards)} usable attempts, fewer than min_valid_per_group={min_valid}"
    if len(set(rewards)) < 2:
        return "every usable attempt has the same reward (no learning signal)"
    return ""


def _usable_rewards(*, run: Run, groups: list[SamplingGroup], plan: dict[str, Any]) -> dict[str, list[float]]:
    trials = list(
        Trial.objects.filter(group__in=groups)
        .order_by("group_id", "attempt")
        .values_list("id", "group_id", "status", "reward")
    )
    cut = truncated_trials(run=run, trial_ids=[t[0] for t in trials]) if plan.get("exclude_truncated") else set()
    rewards: dict[str, list[float]] = {g.id: [] for g in groups}
    for trial_id, group_id, status, reward in trials:
        if status == TrialStatus.SUCCEEDED and reward is not None and math.isfinite(reward) and trial_id not in cut:
            rewards[group_id].append(float(reward))
    return rewards


def groups_refill(*, run: Run, trainer: Trainer, step: int) -> int:
    """Replace the step's settled groups without signal by groups from the dataset cursor,
    within the plan's bound; returns how many were added. The caller holds the run's and
    the trainer's locks (``services.step_settled``), so two calls cannot both replace."""
    plan = run.spec.plan
    bound = int((plan.get("dynamic_sampling") or {}).get("max_refills", 0))
    if bound <= 0:
        return 0
    room = bound - GroupReplacement.objects.filter(run=run, step=step).count()
    if room <= 0:
        return 0
    settled = list(
        SamplingGroup.objects.filter(run=run, step=step, status=GroupStatus.SETTLED, replaced_by__isnull=True).order_by(
            "settled_at", "id"
        )
    )
    rewards = _usable_rewards(run=run, groups=settled, plan=plan)
    empty = [(g, problem) for g in settled if (problem := signal_problem(rewards=rewards[g.id], plan=plan))]
    if not empty:
        return 0
    entries = train_entries(run=run)
    taken = set(SamplingGroup.objects.filter(run=run, step=step).values_list("position", flat=True))
    drawn: list[tuple[int, TaskVersion]] = []
    # The cursor walks on from where the batch stopped (wrapping: epochs), past tasks this
    # step already samples: a replacement is a task the step has not seen.
    scanned = 0
    while len(drawn) < min(room, len(empty)) and scanned < len(entries):
        entry = entries[(trainer.dataset_cursor + scanned) % len(entries)]
        scanned += 1
        if entry[0] not in taken:
            drawn.append(entry)
            taken.add(entry[0])
    if not drawn:
        return 0  # every task of the dataset is in this step already
    added = batch_extend(
        run_id=run.id,
        step=step,
        tasks=drawn,
        attempts=int(plan["group_size"]),
        sampler=trainer.sampler,
        sampler_step=trainer.sampler_step,
    )
    trainer.dataset_cursor += scanned
    trainer.save(update_fields=["dataset_cursor", "updated_at"])
    for (group, problem), replacement in zip(empty, added, strict=False):
        GroupReplacement.objects.create(
            run=run, step=step, replaced=group, replacement=replacement, reason=problem, rewards=rewards[group.id]
        )
        event_append(
            run_id=run.id,
            type="training.group_replaced",
            data={
                "step": step,
                "group": group.id,
                "replacement": replacement.id,
                "task": replacement.task_version.name,
                "reason": problem,
                "rewards": rewards[group.id],
                "refills_left": room - 1,
            },
        )
        room -= 1
    return len(added)


def replacements_summary(*, run_id: str) -> list[dict[str, Any]]:
    """Every replacement of a run, in step order, for its results."""
    return [
        {"step": r.step, "replaced": r.replaced_id, "replacement": r.replacement_id, "reason": r.reason}
        for r in GroupReplacement.objects.filter(run_id=run_id).order_by("step", "created_at", "id")
    ]
