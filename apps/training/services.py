"""Learning for train runs: batches of sampling groups, learning updates, checkpoints.

A train run is driven step by step:

1. ``training_start``: pin the trainer (backend, route, what step 0 samples from) and add
   the first batch (``batch_size`` tasks from the dataset cursor, ``group_size`` attempts
   each) through the runs services.
2. Groups settle as their attempts end; each gives the step's update its contribution at
   once (``apps.training.pipeline.step_feed``: datums, forward/backward), and when the last
   group of the step settles, ``step_settled`` moves the trainer to ``updating`` (and, with
   ``max_staleness`` > 0, starts the next batch on the current weights).
3. ``apps.training.updates.update_apply`` applies the step's learning update, records its
   checkpoint and adds the next batch (or ends the run).

State moves are in ``apps.training.transitions``, the sweeper's redrives in
``apps.training.sweeper``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from apps.proxy.models import ModelRoute
from apps.runs.dispatch import batch_add
from apps.runs.models import GroupStatus, Run, RunStatus, SamplingGroup
from apps.runs.services import event_append
from apps.runs.settlement import run_complete
from apps.training.backends import BackendUnavailable, backend_service, base_model_name
from apps.training.continuation import Start, continuation_start, trainer_end_step
from apps.training.models import Trainer, TrainerStatus
from apps.training.sampling import groups_refill, train_entries
from apps.training.transitions import trainer_transition

# Losses each backend computes (Tinker computes them server-side).
BACKEND_LOSSES = {"local": ("importance_sampling", "ppo"), "tinker": ("importance_sampling", "ppo", "cispo")}


class TrainingFailed(RuntimeError):
    """A problem that ends the train run (bad configuration, no data source)."""


def _start_problem(*, run: Run, route: ModelRoute | None, plan: dict[str, Any]) -> str:
    binding = run.spec.model_binding or {}
    if route is None:
        return f"the actor's model route {binding.get('route')!r} does not exist"
    if not route.trainable:
        return f"model route {route.name!r} is not trainable (route_add --trainable)"
    backend = plan.get("backend", "local")
    if plan.get("loss", "importance_sampling") not in BACKEND_LOSSES.get(backend, ()):
        return f"the {backend} backend does not compute the loss {plan.get('loss')!r}"
    try:
        backend_service(backend=backend, route=route, root=Path(settings.SYNTH_TRAINING_DIR))
    except BackendUnavailable as exc:
        return str(exc)
    return ""


def training_start(*, run_id: str) -> Trainer | None:
    """Set up the learner of a started train run and add its first batch. Idempotent."""
    with transaction.atomic():
        run = Run.objects.select_for_update(no_key=True, of=("self",)).select_related("spec").get(pk=run_id)
        if run.status != RunStatus.RUNNING or Trainer.objects.filter(run=run).exists():
            return None
        plan = run.spec.plan
        binding = dict(run.spec.model_binding or {})
        route = ModelRoute.objects.filter(name=binding.get("route", "")).first()
        backend = plan.get("backend", "local")
        problem = _start_problem(run=run, route=route, plan=plan)
        # A continuation restores the step, the dataset cursor and (exact) the optimizer.
        start = continuation_start(run=run, binding=binding, backend=backend) if not problem else None
        if start is not None and start.problem:
            problem = start.problem
        start = start or Start()
        trainer = Trainer.objects.create(
            run=run,
            backend=backend,
            route=binding.get("route", ""),
            base_model=base_model_name(backend=backend, route=route) if not problem and route else "",
            sampler=binding,
            state_path=start.state_path,
            step=start.step,
            first_step=start.step,
            sampler_step=start.step,  # a continued checkpoint's weights hold its steps
            dataset_cursor=start.dataset_cursor,
            weights_only_state=start.state_path if start.weights_only else "",
            status=TrainerStatus.FAILED if problem else TrainerStatus.SAMPLING,
        )
        if problem:
            event_append(run_id=run.id, type="training.failed", data={"error": problem})
            run_complete(run_id=run.id, error=problem)
            return trainer
        event_append(
            run_id=run.id,
            type="training.started",
            data={
                "backend": backend,
                "route": trainer.route,
                "base_model": trainer.base_model,
                "sampler": binding,
                "first_step": trainer.first_step,
                "dataset_cursor": trainer.dataset_cursor,
                "continuation": plan.get("continuation"),
            },
        )
        try:
            batch_start(run=run, trainer=trainer)
        except TrainingFailed as exc:
            trainer_transition(
                trainer=trainer, to=TrainerStatus.FAILED, event="training.failed", data={"error": str(exc)}
            )
            run_complete(run_id=run.id, error=str(exc))
    return trainer


def batch_start(*, run: Run, trainer: Trainer, step: int | None = None) -> bool:
    """Add ``step`` (default: the trainer's current step) as a batch of groups sampling the
    trainer's current weights. Caller holds the run lock. False if that batch exists (it
    was started early, while the update before it ran)."""
    step = trainer.step if step is None else step
    if SamplingGroup.objects.filter(run=run, step=step).exists():
        return False
    plan = run.spec.plan
    entries = train_entries(run=run)
    if not entries:
        raise TrainingFailed("the dataset (after task_names) has no tasks to train on")
    # The cursor walks the dataset in order and wraps (epochs); a batch never holds one task twice.
    size = min(int(plan.get("batch_size", 4)), len(entries))
    batch = [entries[(trainer.dataset_cursor + i) % len(entries)] for i in range(size)]
    batch_add(
        run_id=run.id,
        step=step,
        tasks=batch,
        attempts=int(plan["group_size"]),
        sampler=trainer.sampler,
        sampler_step=trainer.sampler_step,
    )
    trainer.dataset_cursor += size
    trainer.save(update_fields=["dataset_cursor", "updated_at"])
    return True


def _next_batch_early(*, run: Run, trainer: Trainer) -> None:
    """With ``max_staleness`` k > 0 the batch after the updating step starts now, on the
    weights the trainer has (the update's are not saved yet), if they are at most k steps
    behind it. Caller holds the run lock; the trainer has just moved to updating."""
    plan = run.spec.plan
    following = trainer.step + 1
    if (
        following >= trainer_end_step(trainer=trainer, plan=plan)
        or run.cancel_requested_at is not None
        or run.is_terminal
    ):
        return
    if following - trainer.sampler_step > int(plan.get("max_staleness", 0)):
        return
    try:
        batch_start(run=run, trainer=trainer, step=following)
    except TrainingFailed:
        return  # the strict path meets the same problem after the update and ends the run there


def step_settled(*, run_id: str, step: int) -> bool:
    """When every group of ``step`` has settled, move the trainer to updating and enqueue
    the step's update (once: True for the call that did it)."""
    with transaction.atomic():
        # The run's row first, as everywhere (its trainer's move appends an event).
        list(Run.objects.select_for_update(no_key=True).filter(pk=run_id).values_list("pk", flat=True))
        trainer = (
            Trainer.objects.select_for_update(no_key=True, of=("self",))
            .select_related("run__spec")
            .filter(run_id=run_id)
            .first()
        )
        if trainer is None or trainer.status != TrainerStatus.SAMPLING or trainer.step != step:
            return False
        if trainer.run.is_terminal:  # cancelled: the last trial finalized the run
            trainer_transition(
                trainer=trainer, to=TrainerStatus.DONE, event="training.done", data={"why": "the run ended"}
            )
            return False
        # Dynamic sampling: a settled group without signal is replaced as soon as it settles.
        if groups_refill(run=trainer.run, trainer=trainer, step=step):
            return False
        groups = SamplingGroup.objects.filter(run_id=run_id, step=step)
        if not groups.exists() or groups.exclude(status=GroupStatus.SETTLED).exists():
            return False
        if not trainer_transition(trainer=trainer, to=TrainerStatus.UPDATING, event="training.updating"):
            return False
        _next_batch_early(run=Run.objects.select_related("spec").get(pk=run_id), trainer=trainer)
        from apps.training.tasks import update_apply_task

        # Exactly one update task per step: only the call that moved the trainer enqueues it.
        transaction.on_commit(lambda: update_apply_task.delay(run_id, step))
    return True
