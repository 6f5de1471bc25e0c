"""Learning for train runs: batches of sampling groups, learning updates, checkpoints.

A train run is driven step by step:

1. ``training_start``: pin the trainer (backend, route, what step 0 samples from) and add
   the first batch (``batch_size`` tasks from the dataset cursor, ``group_size`` attempts
   each) through the runs services.
2. Groups settle as their attempts end; when the last group of the step settles,
   ``step_settled`` moves the trainer to ``updating``.
3. ``update_apply``: join each attempt's assessment to its captured tokens (publishing any
   evidence still staged), qualify attempts, apply the plan's eligibility, compute
   group-centred advantages and pack datums (``apps.training.datums``); durably mark the
   update unresolved, run forward_backward + optim_step, save sampler weights and trainer
   state, record the checkpoint and settle the update; then the next batch samples from
   the new checkpoint. An update left unresolved (a crash between the optimizer step and
   the saved checkpoint) blocks automatic continuation: the weights are then unknown.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.objects.packages import dir_pack, package_materialize, snapshot_ref, snapshot_sha256
from apps.objects.selectors import object_get
from apps.objects.services import object_put, object_read
from apps.proxy.capture import interaction_publish
from apps.proxy.models import Eligibility, Integrity, Interaction, ModelRoute
from apps.runs.execution import batch_add, run_complete
from apps.runs.models import GroupStatus, Run, RunStatus, SamplingGroup, TrialStatus
from apps.runs.services import event_append
from apps.training.backends import BackendUnavailable, backend_service, base_model_name
from apps.training.backends.local import LOCAL_SCHEME, path_dir
from apps.training.datums import Attempt, Call, GroupData, datums_to_tinker, group_prepare
from apps.training.models import Checkpoint, LearningUpdate, Trainer, TrainerStatus, UpdateStatus

logger = logging.getLogger(__name__)

# Losses each backend computes (Tinker computes them server-side).
BACKEND_LOSSES = {"local": ("importance_sampling", "ppo"), "tinker": ("importance_sampling", "ppo", "cispo")}

# One live training client per train run in this process, with the state path it holds:
# the next step reuses it instead of reloading, if nothing else trained the run meanwhile.
_clients: dict[str, tuple[str, Any]] = {}
_clients_lock = threading.Lock()


class TrainingFailed(RuntimeError):
    """A problem that ends the train run (bad configuration, no data source)."""


# --------------------------------------------------------------------------- start


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
        run = Run.objects.select_for_update(of=("self",)).select_related("spec").get(pk=run_id)
        if run.status != RunStatus.RUNNING or Trainer.objects.filter(run=run).exists():
            return None
        plan = run.spec.plan
        binding = dict(run.spec.model_binding or {})
        route = ModelRoute.objects.filter(name=binding.get("route", "")).first()
        backend = plan.get("backend", "local")
        problem = _start_problem(run=run, route=route, plan=plan)
        state_path = ""
        if not problem and binding.get("checkpoint"):
            start = Checkpoint.objects.filter(org=run.org, pk=binding["checkpoint"]).first()
            if start is None or not start.state_path:
                problem = f"checkpoint {binding['checkpoint']} has no saved trainer state to continue from"
            elif start.backend != backend:
                problem = f"checkpoint {start.id} was trained with the {start.backend} backend, not {backend}"
            else:
                state_path = start.state_path
        trainer = Trainer.objects.create(
            run=run,
            backend=backend,
            route=binding.get("route", ""),
            base_model=base_model_name(backend=backend, route=route) if not problem and route else "",
            sampler=binding,
            state_path=state_path,
            status=TrainerStatus.FAILED if problem else TrainerStatus.SAMPLING,
        )
        if problem:
            event_append(run_id=run.id, type="training.failed", data={"error": problem})
            run_complete(run_id=run.id, error=problem)
            return trainer
        event_append(
            run_id=run.id,
            type="training.started",
            data={"backend": backend, "route": trainer.route, "base_model": trainer.base_model, "sampler": binding},
        )
        try:
            _batch_start(run=run, trainer=trainer)
        except TrainingFailed as exc:
            trainer.status = TrainerStatus.FAILED
            trainer.save(update_fields=["status", "updated_at"])
            run_complete(run_id=run.id, error=str(exc))
    return trainer


def _batch_start(*, run: Run, trainer: Trainer) -> None:
    """Add the trainer's current step as a batch of groups. Caller holds the run lock."""
    plan = run.spec.plan
    patterns = plan.get("task_names") or []
    entries = [
        (entry.position, entry.task_version)
        for entry in run.spec.dataset_version.entries.select_related("task_version").order_by("position")
        if not patterns or any(fnmatch.fnmatchcase(entry.task_version.name, p) for p in patterns)
    ]
    if not entries:
        raise TrainingFailed("the dataset (after task_names) has no tasks to train on")
    # The cursor walks the dataset in order and wraps (epochs); a batch never holds one task twice.
    size = min(int(plan.get("batch_size", 4)), len(entries))
    batch = [entries[(trainer.dataset_cursor + i) % len(entries)] for i in range(size)]
    batch_add(run_id=run.id, step=trainer.step, tasks=batch, attempts=int(plan["group_size"]), sampler=trainer.sampler)
    trainer.dataset_cursor += size
    trainer.status = TrainerStatus.SAMPLING
    trainer.save(update_fields=["dataset_cursor", "status", "updated_at"])


# --------------------------------------------------------------------------- settle


def step_settled(*, run_id: str, step: int) -> bool:
    """When every group of ``step`` has settled, move the trainer to updating and enqueue
    the step's update (once: True for the call that did it)."""
    with transaction.atomic():
        trainer = Trainer.objects.select_for_update().select_related("run").filter(run_id=run_id).first()
        if trainer is None or trainer.status != TrainerStatus.SAMPLING or trainer.step != step:
            return False
        if trainer.run.is_terminal:  # cancelled: the last trial finalized the run
            trainer.status = TrainerStatus.DONE
            trainer.save(update_fields=["status", "updated_at"])
            return False
        groups = SamplingGroup.objects.filter(run_id=run_id, step=step)
        if not groups.exists() or groups.exclude(status=GroupStatus.SETTLED).exists():
            return False
        trainer.status = TrainerStatus.UPDATING
        trainer.save(update_fields=["status", "updated_at"])
        from apps.training.tasks import update_apply_task

        # Exactly one update task per step: only the call that moved the trainer enqueues it.
        transaction.on_commit(lambda: update_apply_task.delay(run_id, step))
    return True


# --------------------------------------------------------------------------- evidence


def _payload(interaction: Interaction) -> dict[str, Any]:
    """The interaction's token payload from the object store, publishing it first if the
    evidence publisher has not yet (training uses published evidence only)."""
    if interaction.integrity == Integrity.STAGED:
        interaction_publish(interaction_id=interaction.id)
        interaction.refresh_from_db(fields=["integrity", "payload_sha256"])
    obj = object_get(org=interaction.org, sha256=interaction.payload_sha256)
    return json.loads(object_read(obj=obj))


def group_attempts(*, group: SamplingGroup) -> list[Attempt]:
    """The group's attempts with their rewards and captured calls, in call order."""
    trials = list(group.trials.order_by("attempt"))
    calls: dict[str, list[Interaction]] = {t.id: [] for t in trials}
    for interaction in (
        # The attempt's own calls: a judge's calls assessed it and are not the policy's.
        Interaction.objects.filter(org_id=group.run.org_id, run_id=group.run_id, trial_id__in=list(calls), role="actor")
        .select_related("org")
        .order_by("created_at", "id")
    ):
        calls[interaction.trial_id].append(interaction)
    attempts: list[Attempt] = []
    for trial in trials:
        attempt = Attempt(trial_id=trial.id, reward=trial.reward, calls=[])
        if trial.status != TrialStatus.SUCCEEDED:
            attempt.problem = f"attempt {trial.status}"
        for interaction in calls[trial.id]:
            if attempt.problem:
                break
            if interaction.eligibility != Eligibility.ELIGIBLE:
                attempt.problem = f"a model call is not trainable ({interaction.eligibility_reason or 'unsettled'})"
                break
            payload = _payload(interaction)
            attempt.calls.append(
                Call(
                    prompt_ids=payload["prompt_ids"],
                    output_ids=payload["output_ids"],
                    logprobs=payload["logprobs"],
                    agent=payload.get("agent_id") or "",
                )
            )
        attempts.append(attempt)
    return attempts


def _group_summary(data: GroupData) -> dict[str, Any]:
    return {
        "group": data.group_id,
        "attempts": data.attempts,
        "qualified": len(data.qualified),
        "rewards": data.rewards,
        "datums": len(data.datums),
        "skipped": data.skipped or None,
        "problems": data.problems,
    }


# --------------------------------------------------------------------------- backend state


def _local_root() -> Path:
    return Path(settings.SYNTH_TRAINING_DIR)


def _state_to_backend(*, trainer: Trainer) -> str:
    """The backend path of the trainer's saved state (unpacking a local package)."""
    digest = snapshot_sha256(trainer.state_path)
    if digest is not None:
        # Only the newest states are ever resumed from; keep a few.
        directory = package_materialize(sha256=digest, cache_dir=_local_root() / "states", keep=4)
        return f"{LOCAL_SCHEME}{directory}"
    return trainer.state_path


def _training_client(*, trainer: Trainer, plan: dict[str, Any]) -> Any:
    with _clients_lock:
        cached = _clients.get(trainer.run_id)
    if cached is not None and cached[0] == trainer.state_path:
        return cached[1]
    route = ModelRoute.objects.get(name=trainer.route)
    service = backend_service(backend=trainer.backend, route=route, root=_local_root())
    if trainer.state_path:
        client = service.create_training_client_from_state_with_optimizer(_state_to_backend(trainer=trainer)).result()
    else:
        client = service.create_lora_training_client(
            trainer.base_model, rank=int(plan.get("lora_rank", 32)), seed=int(plan.get("seed", 0))
        ).result()
    with _clients_lock:
        _clients[trainer.run_id] = (trainer.state_path, client)
    return client


def _client_forget(run_id: str) -> None:
    with _clients_lock:
        cached = _clients.pop(run_id, None)
    close = getattr(cached[1], "close", None) if cached else None
    if close is not None:
        close()  # the local backend's ordered worker thread and model


def _persist(*, run: Run, path: str) -> tuple[str, str, int | None]:
    """(reference, sha256, size) of saved weights: a local directory is packed into the
    object store (create-only, by digest) and removed; a tinker:// path is kept as is."""
    if not path.startswith(LOCAL_SCHEME):
        return path, "", None
    directory = path_dir(path)
    obj = object_put(org=run.org, data=dir_pack(path=directory), content_type="application/x-tar")
    shutil.rmtree(directory, ignore_errors=True)
    return snapshot_ref(obj.sha256), obj.sha256, obj.size


# --------------------------------------------------------------------------- update


def _kl_sample_train(*, datums: list[Any], outputs: list[dict[str, Any]]) -> float | None:
    """Mean (sampler logprob - trainer logprob) over trained tokens: ~0 when the proxy
    sampled from exactly the weights the trainer holds (on-policy)."""
    total, count = 0.0, 0
    for datum, output in zip(datums, outputs, strict=True):
        trainer_lp = output["logprobs"].tolist()
        for i, advantage in enumerate(datum.advantages):
            if advantage != 0.0:
                total += datum.logprobs[i] - trainer_lp[i]
                count += 1
    return total / count if count else None


def _update_fail(*, update: LearningUpdate, trainer: Trainer, error: str, blocked: bool) -> None:
    _client_forget(trainer.run_id)  # the run will not continue: free the trainer's memory
    with transaction.atomic():
        update.error = error[:20_000]
        update.finished_at = timezone.now()
        if not blocked:
            update.status = UpdateStatus.FAILED
        update.save(update_fields=["status", "error", "finished_at"])
        trainer.status = TrainerStatus.BLOCKED if blocked else TrainerStatus.FAILED
        trainer.save(update_fields=["status", "updated_at"])
        event_append(
            run_id=trainer.run_id,
            type="training.blocked" if blocked else "training.failed",
            data={"step": update.step, "update": update.id, "error": error[:2000]},
        )
        run_complete(run_id=trainer.run_id, error=error, extra_summary=training_summary(run_id=trainer.run_id))


def update_apply(*, run_id: str, step: int) -> LearningUpdate | None:
    """Apply the learning update of ``step`` (the trainer must be ``updating``)."""
    trainer = Trainer.objects.select_related("run__spec", "run__org").get(run_id=run_id)
    run = trainer.run
    plan = run.spec.plan
    if trainer.status != TrainerStatus.UPDATING or trainer.step != step:
        return None
    update, _ = LearningUpdate.objects.get_or_create(run=run, step=step, defaults={"sampler": trainer.sampler})
    if update.status == UpdateStatus.UNRESOLVED:
        # A previous attempt died between the optimizer step and the saved checkpoint.
        _update_fail(
            update=update,
            trainer=trainer,
            error=f"the update of step {step} was left unresolved: its weights are unknown; continue from "
            f"the last checkpoint with a new train run",
            blocked=True,
        )
        return update
    if update.status != UpdateStatus.PENDING:
        return update
    eligibility = plan.get("eligibility") or {}
    started = time.monotonic()
    try:
        groups = list(SamplingGroup.objects.filter(run=run, step=step).select_related("run").order_by("position"))
        prepared = [
            group_prepare(
                group_id=group.id,
                attempts=group_attempts(group=group),
                min_valid=int(eligibility.get("min_valid_per_group", 2)),
                require_variance=bool(eligibility.get("require_reward_variance", True)),
            )
            for group in groups
        ]
    except Exception as exc:  # noqa: BLE001 - any failure to gather data ends the run clearly
        logger.exception("gathering the data of %s step %s failed", run_id, step)
        _update_fail(update=update, trainer=trainer, error=f"gathering step {step}'s data failed: {exc}", blocked=False)
        return update
    datums = [d for g in prepared for d in g.datums]
    rewards = [r for g in prepared for r in g.rewards]
    update.groups = [_group_summary(g) for g in prepared]
    update.datums = len(datums)
    update.sampled_tokens = sum(d.sampled_tokens for d in datums)
    metrics: dict[str, Any] = {
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "attempts_qualified": len(rewards),
        "groups_used": sum(1 for g in prepared if g.datums),
        "groups_skipped": sum(1 for g in prepared if not g.datums),
        "gather_seconds": round(time.monotonic() - started, 3),
    }
    if not datums:
        update.metrics = metrics
        with transaction.atomic():
            update.status = UpdateStatus.SKIPPED
            update.finished_at = timezone.now()
            update.save(update_fields=["status", "groups", "datums", "sampled_tokens", "metrics", "finished_at"])
            event_append(
                run_id=run.id,
                type="training.update_skipped",
                data={"step": step, "update": update.id, "why": "no group gave a learning signal", **metrics},
            )
            _advance(run_id=run.id)
        return update

    # The optimizer step changes weights the database cannot see: record that it is in flight.
    update.status = UpdateStatus.UNRESOLVED
    update.save(update_fields=["status", "groups", "datums", "sampled_tokens"])
    try:
        from tinker import types

        client = _training_client(trainer=trainer, plan=plan)
        wire = datums_to_tinker(datums)
        t0 = time.monotonic()
        backward = client.forward_backward(wire, plan.get("loss", "importance_sampling"))
        optim = client.optim_step(
            types.AdamParams(learning_rate=float(plan["learning_rate"]), beta1=0.9, beta2=0.95, eps=1e-8)
        )
        backward_out = backward.result()
        optim_out = optim.result()
        t1 = time.monotonic()
        name = f"{step + 1:06d}"
        sampler_path = client.save_weights_for_sampler(name).result().path
        state_path = client.save_state(name).result().path
        snapshot, sha256, size = _persist(run=run, path=sampler_path)
        state_ref, _, _ = _persist(run=run, path=state_path)
        t2 = time.monotonic()
    except Exception as exc:  # noqa: BLE001 - the weights may or may not have changed
        logger.exception("the update of %s step %s failed", run_id, step)
        _client_forget(run_id)
        _update_fail(update=update, trainer=trainer, error=f"the update of step {step} failed: {exc}", blocked=True)
        return update
    metrics.update(
        {
            "loss_sum": backward_out.metrics.get("loss:sum"),
            "grad_norm": (optim_out.metrics or {}).get("optim/grad_norm"),
            "kl_sample_train": _kl_sample_train(datums=datums, outputs=backward_out.loss_fn_outputs),
            "train_seconds": round(t1 - t0, 3),
            "save_seconds": round(t2 - t1, 3),
        }
    )
    with transaction.atomic():
        parent_id = (trainer.sampler or {}).get("checkpoint")
        checkpoint = Checkpoint.objects.create(
            org=run.org,
            run=run,
            step=step + 1,
            backend=trainer.backend,
            route=trainer.route,
            base_model=trainer.base_model,
            lora_rank=int(plan.get("lora_rank", 32)),
            snapshot=snapshot,
            state_path=state_ref,
            sha256=sha256,
            size=size,
            parent_id=parent_id,
            milestone=(step + 1) % int(plan.get("save_every", 5)) == 0 or step + 1 >= int(plan["steps"]),
        )
        update.status = UpdateStatus.APPLIED
        update.metrics = metrics
        update.checkpoint = checkpoint
        update.finished_at = timezone.now()
        update.save(update_fields=["status", "metrics", "checkpoint", "finished_at"])
        trainer.sampler = checkpoint.binding()
        trainer.state_path = state_ref
        trainer.save(update_fields=["sampler", "state_path", "updated_at"])
        event_append(
            run_id=run.id,
            type="training.update_applied",
            data={"step": step, "update": update.id, "datums": len(datums), **metrics},
        )
        event_append(
            run_id=run.id,
            type="checkpoint.saved",
            data={"checkpoint": checkpoint.id, "step": checkpoint.step, "snapshot": snapshot, "sha256": sha256},
        )
        with _clients_lock:
            if run.id in _clients:
                _clients[run.id] = (state_ref, _clients[run.id][1])
        _advance(run_id=run.id)
    return update


def _advance(*, run_id: str) -> None:
    """After an update: the next batch, or the end of the run. Caller is in a transaction."""
    run = Run.objects.select_for_update(of=("self",)).select_related("spec").get(pk=run_id)
    trainer = Trainer.objects.select_for_update().get(run=run)
    trainer.step += 1
    if trainer.step >= int(run.spec.plan["steps"]) or run.cancel_requested_at is not None or run.is_terminal:
        trainer.status = TrainerStatus.DONE
        trainer.save(update_fields=["step", "status", "updated_at"])
        transaction.on_commit(lambda: _client_forget(run_id))
        if not run.is_terminal:
            run_complete(run_id=run_id, extra_summary=training_summary(run_id=run_id))
        return
    trainer.save(update_fields=["step", "updated_at"])
    try:
        _batch_start(run=run, trainer=trainer)
    except TrainingFailed as exc:
        trainer.status = TrainerStatus.FAILED
        trainer.save(update_fields=["status", "updated_at"])
        run_complete(run_id=run_id, error=str(exc), extra_summary=training_summary(run_id=run_id))


def training_summary(*, run_id: str) -> dict[str, Any]:
    """The train run's learning, for its summary: per step reward, and the checkpoints."""
    updates = list(LearningUpdate.objects.filter(run_id=run_id).order_by("step"))
    checkpoints = list(Checkpoint.objects.filter(run_id=run_id).order_by("step").values_list("id", flat=True))
    return {
        "training": {
            "steps": len(updates),
            "applied": sum(1 for u in updates if u.status == UpdateStatus.APPLIED),
            "skipped": sum(1 for u in updates if u.status == UpdateStatus.SKIPPED),
            "reward_by_step": [u.metrics.get("reward_mean") for u in updates],
            "checkpoints": checkpoints,
            "final_checkpoint": checkpoints[-1] if checkpoints else None,
        }
    }
