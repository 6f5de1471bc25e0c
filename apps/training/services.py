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
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from apps.core.process import process_alive, process_identity
from apps.core.transitions import TransitionTable
from apps.objects.packages import dir_pack, package_materialize, snapshot_ref, snapshot_sha256
from apps.objects.selectors import object_get
from apps.objects.services import object_put, object_read
from apps.proxy.capture import interaction_publish
from apps.proxy.models import Eligibility, Integrity, Interaction, ModelRoute
from apps.runs.dispatch import batch_add
from apps.runs.models import GroupStatus, Run, RunKind, RunStatus, SamplingGroup, TrialStatus
from apps.runs.services import event_append
from apps.runs.settlement import run_complete
from apps.runs.sweeper import sweep_note
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


# --------------------------------------------------------------------------- transitions

TRAINER_TRANSITIONS = TransitionTable(
    model=Trainer,
    moves={
        TrainerStatus.SAMPLING: {TrainerStatus.UPDATING, TrainerStatus.DONE, TrainerStatus.FAILED},
        TrainerStatus.UPDATING: {
            TrainerStatus.SAMPLING,
            TrainerStatus.DONE,
            TrainerStatus.FAILED,
            TrainerStatus.BLOCKED,
        },
    },
)

UPDATE_TRANSITIONS = TransitionTable(
    model=LearningUpdate,
    moves={
        UpdateStatus.PENDING: {UpdateStatus.UNRESOLVED, UpdateStatus.SKIPPED, UpdateStatus.FAILED},
        # An unresolved update that cannot be confirmed stays unresolved: its trainer blocks.
        UpdateStatus.UNRESOLVED: {UpdateStatus.APPLIED},
    },
)

UPDATE_ENDED = (UpdateStatus.APPLIED, UpdateStatus.SKIPPED, UpdateStatus.FAILED)


def trainer_transition(*, trainer: Trainer, to: str, event: str, data: dict[str, Any] | None = None) -> bool:
    """Move a trainer and append ``event`` on its run, in one transaction."""
    with transaction.atomic():
        list(Run.objects.select_for_update().filter(pk=trainer.run_id).values_list("pk", flat=True))
        if not TRAINER_TRANSITIONS.claim(pk=trainer.pk, to=to, values={"updated_at": timezone.now()}, instance=trainer):
            return False
        event_append(run_id=trainer.run_id, type=event, data={"step": trainer.step, **(data or {})})
    return True


def update_transition(
    *,
    update: LearningUpdate,
    to: str,
    event: str,
    data: dict[str, Any] | None = None,
    values: dict[str, Any] | None = None,
    holder: str | None = None,
) -> bool:
    """Move a learning update and append ``event`` on its run, in one transaction. With
    ``holder``, only while that process still holds the update (not taken over)."""
    changes = dict(values or {})
    if to in UPDATE_ENDED:
        changes.setdefault("finished_at", timezone.now())
    with transaction.atomic():
        list(Run.objects.select_for_update().filter(pk=update.run_id).values_list("pk", flat=True))
        if not UPDATE_TRANSITIONS.claim(
            pk=update.pk,
            to=to,
            values=changes,
            where={"holder": holder} if holder is not None else None,
            instance=update,
        ):
            return False
        event_append(run_id=update.run_id, type=event, data={"step": update.step, "update": update.id, **(data or {})})
    return True


# --------------------------------------------------------------------------- holders


def _update_ttl() -> timedelta:
    return timedelta(seconds=settings.SYNTH_LEASE_TTL_SECONDS)


def _update_take(*, update: LearningUpdate, holder: str) -> bool:
    """Hold a pending update for this process: one conditional UPDATE, so two deliveries of
    the same step cannot both run it. A holder whose heartbeat lapsed is gone."""
    now = timezone.now()
    taken = (
        LearningUpdate.objects.filter(pk=update.pk, status=UpdateStatus.PENDING)
        .filter(Q(heartbeat_at__isnull=True) | Q(heartbeat_at__lt=now - _update_ttl()) | Q(holder=holder))
        .update(holder=holder, heartbeat_at=now)
    )
    return taken == 1


def _holder_gone(*, update: LearningUpdate, now: datetime) -> bool:
    if update.heartbeat_at is None or update.heartbeat_at < now - _update_ttl():
        return True
    return process_alive(identity=update.holder) is False  # known dead on this host: no need to wait


class UpdateKeeper(threading.Thread):
    """Heartbeats a held update while the process applies it."""

    def __init__(self, *, update_id: str, holder: str) -> None:
        super().__init__(name=f"update-{update_id}", daemon=True)
        self.update_id = update_id
        self.holder = holder
        self.interval = max(0.2, min(settings.SYNTH_LEASE_TTL_SECONDS / 3, 5.0))
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while not self._halt.wait(self.interval):
                try:
                    held = LearningUpdate.objects.filter(
                        pk=self.update_id,
                        holder=self.holder,
                        status__in=[UpdateStatus.PENDING, UpdateStatus.UNRESOLVED],
                    ).update(heartbeat_at=timezone.now())
                except Exception:  # a database hiccup: try again next beat, the TTL covers it
                    logger.exception("heartbeat of update %s failed", self.update_id)
                    connections.close_all()
                    continue
                if not held:
                    return  # ended or taken over: its final writes will be refused
        finally:
            connections.close_all()

    def stop(self) -> None:
        self._halt.set()


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
            trainer_transition(
                trainer=trainer, to=TrainerStatus.FAILED, event="training.failed", data={"error": str(exc)}
            )
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
    trainer.save(update_fields=["dataset_cursor", "updated_at"])


# --------------------------------------------------------------------------- settle


def step_settled(*, run_id: str, step: int) -> bool:
    """When every group of ``step`` has settled, move the trainer to updating and enqueue
    the step's update (once: True for the call that did it)."""
    with transaction.atomic():
        # The run's row first, as everywhere (its trainer's move appends an event).
        list(Run.objects.select_for_update().filter(pk=run_id).values_list("pk", flat=True))
        trainer = Trainer.objects.select_for_update(of=("self",)).select_related("run").filter(run_id=run_id).first()
        if trainer is None or trainer.status != TrainerStatus.SAMPLING or trainer.step != step:
            return False
        if trainer.run.is_terminal:  # cancelled: the last trial finalized the run
            trainer_transition(
                trainer=trainer, to=TrainerStatus.DONE, event="training.done", data={"why": "the run ended"}
            )
            return False
        groups = SamplingGroup.objects.filter(run_id=run_id, step=step)
        if not groups.exists() or groups.exclude(status=GroupStatus.SETTLED).exists():
            return False
        if not trainer_transition(trainer=trainer, to=TrainerStatus.UPDATING, event="training.updating"):
            return False
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
    """End the run on a failed update: failed (nothing changed the weights) or blocked (an
    optimizer step may have: the update stays unresolved and nobody holds it)."""
    _client_forget(trainer.run_id)  # the run will not continue: free the trainer's memory
    with transaction.atomic():
        if blocked:
            LearningUpdate.objects.filter(pk=update.pk).update(
                error=error[:20_000], finished_at=timezone.now(), holder="", heartbeat_at=None
            )
        else:
            update_transition(
                update=update,
                to=UpdateStatus.FAILED,
                event="training.update_failed",
                data={"error": error[:2000]},
                values={"error": error[:20_000]},
            )
        trainer_transition(
            trainer=trainer,
            to=TrainerStatus.BLOCKED if blocked else TrainerStatus.FAILED,
            event="training.blocked" if blocked else "training.failed",
            data={"step": update.step, "update": update.id, "error": error[:2000]},
        )
        run_complete(run_id=trainer.run_id, error=error, extra_summary=training_summary(run_id=trainer.run_id))


def update_apply(*, run_id: str, step: int) -> LearningUpdate | None:
    """Apply the learning update of ``step`` (the trainer must be ``updating``). Safe to
    deliver twice: one process holds the update at a time, the others return."""
    trainer = Trainer.objects.select_related("run__spec", "run__org").get(run_id=run_id)
    if trainer.status != TrainerStatus.UPDATING or trainer.step != step:
        return None
    update, _ = LearningUpdate.objects.get_or_create(run=trainer.run, step=step, defaults={"sampler": trainer.sampler})
    if update.status == UpdateStatus.UNRESOLVED:
        if not _holder_gone(update=update, now=timezone.now()):
            return None  # a live process is applying it (this is a second delivery)
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
    holder = process_identity()
    if not _update_take(update=update, holder=holder):
        return None  # a live process holds it
    keeper = UpdateKeeper(update_id=update.id, holder=holder)
    keeper.start()
    try:
        return _update_run(trainer=trainer, update=update, holder=holder)
    finally:
        keeper.stop()


def _update_run(*, trainer: Trainer, update: LearningUpdate, holder: str) -> LearningUpdate:
    run = trainer.run
    plan = run.spec.plan
    step = update.step
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
        logger.exception("gathering the data of %s step %s failed", run.id, step)
        _update_fail(update=update, trainer=trainer, error=f"gathering step {step}'s data failed: {exc}", blocked=False)
        return update
    datums = [d for g in prepared for d in g.datums]
    rewards = [r for g in prepared for r in g.rewards]
    gathered = {
        "groups": [_group_summary(g) for g in prepared],
        "datums": len(datums),
        "sampled_tokens": sum(d.sampled_tokens for d in datums),
    }
    metrics: dict[str, Any] = {
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "attempts_qualified": len(rewards),
        "groups_used": sum(1 for g in prepared if g.datums),
        "groups_skipped": sum(1 for g in prepared if not g.datums),
        "gather_seconds": round(time.monotonic() - started, 3),
    }
    if not datums:
        with transaction.atomic():
            if update_transition(
                update=update,
                to=UpdateStatus.SKIPPED,
                event="training.update_skipped",
                data={"why": "no group gave a learning signal", **metrics},
                values={**gathered, "metrics": metrics},
                holder=holder,
            ):
                _advance(run_id=run.id)
        return update

    # The optimizer step changes weights the database cannot see: record that it is in flight.
    if not update_transition(
        update=update,
        to=UpdateStatus.UNRESOLVED,
        event="training.update_submitted",
        data={"datums": len(datums), "sampled_tokens": gathered["sampled_tokens"]},
        values=gathered,
        holder=holder,
    ):
        logger.warning("the update of %s step %s was taken over before its optimizer step", run.id, step)
        return update
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
        logger.exception("the update of %s step %s failed", run.id, step)
        _client_forget(run.id)
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
        if not update_transition(
            update=update,
            to=UpdateStatus.APPLIED,
            event="training.update_applied",
            data={"datums": len(datums), **metrics},
            values={"metrics": metrics, "checkpoint": checkpoint},
            holder=holder,
        ):
            # The sweeper blocked the run meanwhile (this process' heartbeat lapsed): the
            # run has ended, so these weights are not recorded as its progress.
            logger.warning("the update of %s step %s was blocked before it was confirmed", run.id, step)
            transaction.set_rollback(True)
            return update
        trainer.sampler = checkpoint.binding()
        trainer.state_path = state_ref
        trainer.save(update_fields=["sampler", "state_path", "updated_at"])
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
    trainer.save(update_fields=["step", "updated_at"])
    if trainer.step >= int(run.spec.plan["steps"]) or run.cancel_requested_at is not None or run.is_terminal:
        trainer_transition(trainer=trainer, to=TrainerStatus.DONE, event="training.done")
        transaction.on_commit(lambda: _client_forget(run_id))
        if not run.is_terminal:
            run_complete(run_id=run_id, extra_summary=training_summary(run_id=run_id))
        return
    trainer_transition(
        trainer=trainer, to=TrainerStatus.SAMPLING, event="training.sampling", data={"sampler": trainer.sampler}
    )
    try:
        _batch_start(run=run, trainer=trainer)
    except TrainingFailed as exc:
        trainer_transition(trainer=trainer, to=TrainerStatus.FAILED, event="training.failed", data={"error": str(exc)})
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


# --------------------------------------------------------------------------- sweep


def training_sweep(*, now: datetime, limit: int) -> dict[str, int]:
    """The learner's part of the sweeper's tick (see apps.runs.sweeper): train runs whose
    start or step message was lost, and learning updates whose worker is gone."""
    counts: dict[str, int] = {}
    grace = timedelta(seconds=settings.SYNTH_SWEEP_GRACE_SECONDS)
    queue_grace = timedelta(seconds=settings.SYNTH_SWEEP_TRIAL_GRACE_SECONDS)
    for what, redrive in (
        ("training_started", lambda: _sweep_unstarted(now=now, grace=grace, limit=limit)),
        ("steps_settled", lambda: _sweep_unsettled_steps(now=now, grace=grace, limit=limit)),
        ("updates_blocked", lambda: _sweep_dead_updates(now=now, limit=limit)),
        # Updates queue behind other runs' on the one training worker: the longer grace.
        ("updates_requeued", lambda: _sweep_unheld_updates(now=now, grace=queue_grace, limit=limit)),
    ):
        try:
            moved = redrive()
        except Exception:
            logger.exception("training sweep: %s failed", what)
            counts["errors"] = counts.get("errors", 0) + 1
            continue
        if moved:
            counts[what] = moved
    return counts


def _sweep_unstarted(*, now: datetime, grace: timedelta, limit: int) -> int:
    runs = list(
        Run.objects.filter(kind=RunKind.TRAIN, status=RunStatus.RUNNING, updated_at__lt=now - grace)
        .exclude(Exists(Trainer.objects.filter(run=OuterRef("pk"))))
        .values_list("pk", flat=True)[:limit]
    )
    started = 0
    for run_id in runs:
        if training_start(run_id=run_id) is not None:
            sweep_note(
                run_id=run_id, action="training_started", why="started but its learner never set up (lost message)"
            )
            started += 1
    return started


def _sweep_unsettled_steps(*, now: datetime, grace: timedelta, limit: int) -> int:
    trainers = list(
        Trainer.objects.filter(status=TrainerStatus.SAMPLING, updated_at__lt=now - grace)
        .filter(Exists(SamplingGroup.objects.filter(run=OuterRef("run"), step=OuterRef("step"))))
        .exclude(
            Exists(
                SamplingGroup.objects.filter(run=OuterRef("run"), step=OuterRef("step")).exclude(
                    status=GroupStatus.SETTLED
                )
            )
        )
        .values_list("run_id", "step")[:limit]
    )
    moved = 0
    for run_id, step in trainers:
        if step_settled(run_id=run_id, step=step):
            sweep_note(
                run_id=run_id,
                action="step_settled",
                why=f"every group of step {step} had settled but the learner was not told (lost message)",
            )
            moved += 1
    return moved


def _sweep_dead_updates(*, now: datetime, limit: int) -> int:
    """Unresolved updates whose worker is gone: the optimizer step was in flight, so the
    weights are unknown. Block the run now, with the reason, instead of waiting for the
    broker to redeliver the message hours later."""
    candidates = list(
        LearningUpdate.objects.filter(status=UpdateStatus.UNRESOLVED)
        .filter(
            Exists(Trainer.objects.filter(run=OuterRef("run"), step=OuterRef("step"), status=TrainerStatus.UPDATING))
        )
        .order_by("pk")[:limit]
    )
    blocked = 0
    for update in candidates:
        if not _holder_gone(update=update, now=now):
            continue
        seen = f"{int((now - update.heartbeat_at).total_seconds())} s ago" if update.heartbeat_at else "never"
        error = (
            f"the training worker applying step {update.step} ({update.holder or 'unknown'}) stopped heartbeating "
            f"(last heard {seen}) with its optimizer step in flight: the weights are unknown; continue from the "
            "last checkpoint with a new train run"
        )
        with transaction.atomic():
            # Under the run and trainer locks, so that two overlapping ticks block it once.
            list(Run.objects.select_for_update().filter(pk=update.run_id).values_list("pk", flat=True))
            trainer = Trainer.objects.select_for_update().get(run_id=update.run_id)
            if trainer.status != TrainerStatus.UPDATING or trainer.step != update.step:
                continue
            sweep_note(run_id=update.run_id, action="update_blocked", why=error)
            _update_fail(update=update, trainer=trainer, error=error, blocked=True)
        blocked += 1
    return blocked


def _sweep_unheld_updates(*, now: datetime, grace: timedelta, limit: int) -> int:
    """Trainers updating whose update no live process holds: never taken (the message was
    lost) or its holder died while gathering data (nothing changed the weights). Hand the
    step to the training queue again; the trainer's updated_at restarts the grace period."""
    from apps.training.tasks import update_apply_task

    held = LearningUpdate.objects.filter(
        run=OuterRef("run"), step=OuterRef("step"), heartbeat_at__gte=now - _update_ttl()
    ).exclude(status=UpdateStatus.UNRESOLVED)
    trainers = list(
        Trainer.objects.filter(status=TrainerStatus.UPDATING, updated_at__lt=now - grace)
        .exclude(Exists(held))
        .exclude(
            Exists(
                LearningUpdate.objects.filter(
                    run=OuterRef("run"), step=OuterRef("step"), status=UpdateStatus.UNRESOLVED
                )
            )
        )
        .values_list("run_id", "step")[:limit]
    )
    requeued = 0
    for run_id, step in trainers:
        with transaction.atomic():
            touched = Trainer.objects.filter(
                run_id=run_id, step=step, status=TrainerStatus.UPDATING, updated_at__lt=now - grace
            ).update(updated_at=timezone.now())
            if not touched:
                continue
            update = LearningUpdate.objects.filter(run_id=run_id, step=step).first()
            if update is not None and update.holder:
                why = f"its training worker ({update.holder}) stopped heartbeating while gathering data; redone"
            else:
                why = f"step {step}'s update was never taken by a training worker (lost message)"
            LearningUpdate.objects.filter(run_id=run_id, step=step, status=UpdateStatus.PENDING).update(
                holder="", heartbeat_at=None
            )
            sweep_note(run_id=run_id, action="update_requeued", why=why)
            transaction.on_commit(lambda run_id=run_id, step=step: update_apply_task.delay(run_id, step))
        requeued += 1
    return requeued
