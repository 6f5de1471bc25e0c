"""Continuing a train run from a checkpoint.

A checkpoint's state package holds the weights and the optimizer state (Adam's moments
and step counters); its ``resume`` record holds what else the learner needs to go on as if
it had not stopped: the dataset cursor, the dataset and task filter the cursor walks, and
the LoRA seed. A train run whose actor names a checkpoint continues it:

* ``exact`` (the default): weights, optimizer state, step number and dataset cursor are
  restored, so N steps then M more give the weights N + M steps would have;
* ``weights_only`` (only when the plan says so): the weights with a fresh optimizer, the
  cursor at the start of the dataset; for checkpoints saved before ``resume`` was recorded,
  or to go on with another dataset.

Plan values that contradict the saved state are refused at submission
(``train_plan_resolve``, the runs app's SYNTH_TRAIN_PLAN_RESOLVER), naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apps.accounts.models import Organization
from apps.core.errors import ValidationFailed
from apps.proxy.models import ModelRoute
from apps.runs.models import Run
from apps.training.backends import BackendUnavailable, base_model_name
from apps.training.models import Checkpoint, Trainer

RESUME_FORMAT = 1


def checkpoint_resume(*, run: Run, trainer: Trainer, plan: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint saved now records for exact continuation. ``trainer.dataset_cursor``
    is where the next batch starts (this step's batch and refills are already drawn)."""
    return {
        "format": RESUME_FORMAT,
        "dataset_cursor": trainer.dataset_cursor,
        "dataset_digest": run.spec.dataset_digest,
        "task_names": list(plan.get("task_names") or []),
        "seed": int(plan.get("seed", 0)),
        "optimizer": True,  # save_state saves the optimizer with the weights on both backends
    }


def _refuse(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(f"{field}: {message}", field=field)


def train_plan_resolve(
    *, org: Organization, binding: dict[str, Any], plan: dict[str, Any], given: set[str], dataset_digest: str
) -> dict[str, Any]:
    """The train plan to pin, checked against the checkpoint it continues (if any).

    ``given`` are the plan keys the submitter wrote: a default (``lora_rank`` 32) gives way
    to the checkpoint's value, an explicit contradiction is a ValidationFailed naming it."""
    mode = plan.get("continuation")
    checkpoint_id = binding.get("checkpoint")
    if not checkpoint_id:
        if mode:
            raise _refuse("plan.continuation", "applies only when the actor's model is a checkpoint")
        return plan
    checkpoint = Checkpoint.objects.filter(org=org, pk=checkpoint_id).first()
    if checkpoint is None:  # the binding was resolved in this organization just before
        raise _refuse("actor.model.checkpoint", f"checkpoint {checkpoint_id} not found")
    mode = mode or "exact"
    if not checkpoint.state_path:
        raise _refuse(
            "actor.model.checkpoint", f"checkpoint {checkpoint.id} has no saved trainer state to continue from"
        )
    if "backend" in given and plan["backend"] != checkpoint.backend:
        raise _refuse(
            "plan.backend", f"checkpoint {checkpoint.id} was trained with the {checkpoint.backend} backend; "
            f"a continuation keeps it (omit backend or give {checkpoint.backend!r})"
        )  # fmt: skip
    if "lora_rank" in given and plan["lora_rank"] != checkpoint.lora_rank:
        raise _refuse(
            "plan.lora_rank", f"checkpoint {checkpoint.id} has LoRA rank {checkpoint.lora_rank}, not "
            f"{plan['lora_rank']}; a continuation keeps its rank (omit lora_rank or give {checkpoint.lora_rank})"
        )  # fmt: skip
    route = ModelRoute.objects.filter(name=checkpoint.route).first()
    try:
        base_model = base_model_name(backend=checkpoint.backend, route=route) if route else None
    except BackendUnavailable:
        base_model = None
    if base_model != checkpoint.base_model:
        raise _refuse(
            "actor.model.checkpoint", f"checkpoint {checkpoint.id} adapts the base model {checkpoint.base_model!r}; "
            f"route {checkpoint.route!r} now serves {base_model!r}"
        )  # fmt: skip
    resume = checkpoint.resume or {}
    pinned = {**plan, "continuation": mode, "backend": checkpoint.backend, "lora_rank": checkpoint.lora_rank}
    if mode == "weights_only":
        return pinned
    if not resume:
        raise _refuse(
            "plan.continuation", f"checkpoint {checkpoint.id} was saved without a dataset cursor, so it cannot be "
            'continued exactly; give "continuation": "weights_only" to continue its weights with a fresh optimizer'
        )  # fmt: skip
    if "seed" in given and plan["seed"] != resume["seed"]:
        raise _refuse(
            "plan.seed", f"checkpoint {checkpoint.id}'s LoRA weights were initialised with seed {resume['seed']}; "
            f"an exact continuation keeps it (omit seed or give {resume['seed']})"
        )  # fmt: skip
    if dataset_digest != resume["dataset_digest"]:
        raise _refuse(
            "dataset", f"checkpoint {checkpoint.id}'s dataset cursor walks another dataset version; an exact "
            'continuation uses the same one (or give "continuation": "weights_only")'
        )  # fmt: skip
    if list(plan.get("task_names") or []) != resume["task_names"]:
        raise _refuse(
            "plan.task_names", f"checkpoint {checkpoint.id}'s dataset cursor walks task_names {resume['task_names']}; "
            'an exact continuation keeps them (or give "continuation": "weights_only")'
        )  # fmt: skip
    return {**pinned, "seed": resume["seed"]}


@dataclass(frozen=True)
class Start:
    """Where a train run's learner starts."""

    state_path: str = ""  # "" = fresh LoRA weights
    step: int = 0
    dataset_cursor: int = 0
    weights_only: bool = False
    problem: str = ""


def continuation_start(*, run: Run, binding: dict[str, Any], backend: str) -> Start:
    """The learner's start: fresh, or the checkpoint the actor names (checked again here:
    the checkpoint was valid at submission, its state must still be there)."""
    if not binding.get("checkpoint"):
        return Start()
    start = Checkpoint.objects.filter(org=run.org, pk=binding["checkpoint"]).first()
    if start is None or not start.state_path:
        return Start(problem=f"checkpoint {binding['checkpoint']} has no saved trainer state to continue from")
    if start.backend != backend:
        return Start(problem=f"checkpoint {start.id} was trained with the {start.backend} backend, not {backend}")
    mode = run.spec.plan.get("continuation") or "exact"
    if mode == "weights_only":
        return Start(state_path=start.state_path, step=start.step, weights_only=True)
    if not start.resume:
        return Start(
            problem=f"checkpoint {start.id} was saved without a dataset cursor; it cannot be continued exactly"
        )
    return Start(state_path=start.state_path, step=start.step, dataset_cursor=int(start.resume["dataset_cursor"]))


def trainer_end_step(*, trainer: Trainer, plan: dict[str, Any]) -> int:
    """The step number at which the run has taken its plan's updates."""
    return trainer.first_step + int(plan["steps"])
