"""Driving a train run's learner step by step without workers: each attempt of a step gets
a published model call (deterministic tokens from its task, attempt and step) and a
reward, the step settles, and its update runs in this process on the local backend."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.db import transaction

from apps.accounts.models import Organization
from apps.datasets.models import DatasetVersion
from apps.objects.services import object_put
from apps.proxy.models import Eligibility, Integrity, Interaction, ModelRoute
from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
from apps.runs.dispatch import run_dispatch
from apps.runs.models import Run, SamplingGroup, Trial
from apps.runs.services import run_schedule, run_submit
from apps.runs.settlement import trial_settle
from apps.training.models import LearningUpdate
from apps.training.services import step_settled
from apps.training.updates import update_apply
from tests.factories import make_profile_version

# rewards of attempt 0, 1, ... of every group (variance: each group gives signal)
Rewards = Callable[[SamplingGroup, Trial], float]


def alternating(group: SamplingGroup, trial: Trial) -> float:
    return 1.0 if trial.attempt % 2 == 0 else 0.0


def submit_train(
    *, org: Organization, dataset: DatasetVersion, model: dict[str, Any], plan: dict[str, Any], key: str
) -> Run:
    """A train run admitted, scheduled and dispatched (its learner not yet started)."""
    route_upsert(**DEFAULT_ROUTE)
    recipe = {"model": model, "engine": {"name": "synth-mini", "version": "1"}}
    profile = make_profile_version(org=org, name=f"mini-{key}", recipe=recipe)
    body = {
        "kind": "train",
        "dataset": dataset.reference,
        "actor": {"profile": profile.profile.name, "version": profile.version},
        "plan": plan,
    }
    run, _ = run_submit(org=org, user=None, idempotency_key=key, body=body)
    run_schedule(run_id=run.id)
    run_dispatch(run_id=run.id)
    return Run.objects.get(pk=run.pk)


def call_stored(
    *,
    trial: Trial,
    payload: dict[str, Any],
    stop_reason: str = "end_turn",
    integrity: str = Integrity.PUBLISHED,
    eligibility: str = Eligibility.ELIGIBLE,
    eligibility_reason: str = "",
) -> Interaction:
    """A settled model call of ``trial`` whose token payload (prompt_ids, output_ids,
    logprobs) is stored in the object store."""
    data = json.dumps(payload, sort_keys=True).encode()
    obj = object_put(org=trial.run.org, data=data, content_type="application/json")
    return Interaction.objects.create(
        org=trial.run.org,
        principal_kind="credential",
        run_id=trial.run_id,
        trial_id=trial.id,
        role="actor",
        route=ModelRoute.objects.get(name=DEFAULT_ROUTE["name"]),
        model_requested="qwen3-8b",
        stop_reason=stop_reason,
        prompt_tokens=len(payload["prompt_ids"]),
        output_tokens=len(payload["output_ids"]),
        integrity=integrity,
        eligibility=eligibility,
        eligibility_reason=eligibility_reason,
        payload_sha256=obj.sha256,
        payload_size=obj.size,
    )


def call_add(*, trial: Trial, step: int, stop_reason: str = "end_turn") -> Interaction:
    """One published, eligible model call of ``trial`` whose tokens depend only on the
    task's dataset position, the attempt number and the step (not on ids)."""
    group = trial.group
    seed = 1000 + 97 * group.position + 13 * trial.attempt + 7 * step
    payload = {
        "prompt_ids": [seed + i for i in range(6)],
        "output_ids": [seed + 50 + i for i in range(4)],
        "logprobs": [-2.0, -1.5, -2.5, -1.0],
    }
    return call_stored(trial=trial, payload=payload, stop_reason=stop_reason)


def groups_play(
    *,
    run: Run,
    groups: list[SamplingGroup],
    rewards: Rewards = alternating,
    truncated: Callable[[Trial], bool] = lambda t: False,
) -> None:
    """The attempts of ``groups`` ran (a model call each) and ended with ``rewards``."""
    trials = list(
        Trial.objects.filter(group__in=groups)
        .select_related("group", "run__org")
        .order_by("group__position", "attempt")
    )
    Trial.objects.filter(pk__in=[t.pk for t in trials]).update(status="running")
    for trial in trials:
        call_add(trial=trial, step=trial.group.step, stop_reason="max_tokens" if truncated(trial) else "end_turn")
        with transaction.atomic():
            trial_settle(
                run=Run.objects.get(pk=run.pk),
                trial=Trial.objects.get(pk=trial.pk),
                status="succeeded",
                rewards={"reward": rewards(trial.group, trial)},
            )


def step_play(*, run: Run, step: int, rewards: Rewards = alternating) -> LearningUpdate:
    """Play every group of ``step``, settle it and apply its update."""
    groups = list(SamplingGroup.objects.filter(run=run, step=step).order_by("position"))
    assert groups, f"step {step} has no groups"
    groups_play(run=run, groups=groups, rewards=rewards)
    assert step_settled(run_id=run.id, step=step)
    update = update_apply(run_id=run.id, step=step)
    assert update is not None
    return update
