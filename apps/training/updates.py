"""Learning updates: holding one per process, gathering a step's data, the optimizer step,
the checkpoint, and what comes after (the next batch or the end of the run).

``update_apply`` takes the step's contributions (``apps.training.pipeline``: recorded as
each group settled, or now for any that were not), submits the forward/backward of those
its process' training client has not accumulated, durably marks the update unresolved,
steps the optimizer, saves sampler weights and trainer state, records the checkpoint and
settles the update; then the next batch samples from the new checkpoint (or is already
sampling the previous one, with ``max_staleness`` > 0). An update left unresolved (a crash between the optimizer step and the saved
checkpoint) blocks automatic continuation: the weights are then unknown.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Q
from django.utils import timezone

from apps.core.process import process_alive, process_identity
from apps.runs.models import Run
from apps.runs.services import event_append, run_cancel
from apps.runs.settlement import LIVE_TRIAL, run_complete
from apps.training.clients import (
    client_forget,
    client_lock,
    client_skip,
    client_state_note,
    live_client,
    weights_persist,
)
from apps.training.continuation import checkpoint_resume, trainer_end_step
from apps.training.models import (
    Checkpoint,
    ContributionStatus,
    GroupContribution,
    LearningUpdate,
    Trainer,
    TrainerStatus,
    UpdateStatus,
)
from apps.training.pipeline import INCLUDED, Recorded, contribution_submit, contributions_record
from apps.training.sampling import TRUNCATED, replacements_summary
from apps.training.services import TrainingFailed, batch_start
from apps.training.transitions import trainer_transition, update_transition

logger = logging.getLogger(__name__)


def update_ttl() -> timedelta:
    return timedelta(seconds=settings.SYNTH_LEASE_TTL_SECONDS)


def _update_take(*, update: LearningUpdate, holder: str) -> bool:
    """Hold a pending update for this process: one conditional UPDATE, so two deliveries of
    the same step cannot both run it. A holder whose heartbeat lapsed is gone."""
    now = timezone.now()
    taken = (
        LearningUpdate.objects.filter(pk=update.pk, status=UpdateStatus.PENDING)
        .filter(Q(heartbeat_at__isnull=True) | Q(heartbeat_at__lt=now - update_ttl()) | Q(holder=holder))
        .update(holder=holder, heartbeat_at=now)
    )
    return taken == 1


def holder_gone(*, update: LearningUpdate, now: datetime) -> bool:
    if update.heartbeat_at is None or update.heartbeat_at < now - update_ttl():
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


def update_fail(*, update: LearningUpdate, trainer: Trainer, error: str, blocked: bool) -> None:
    """End the run on a failed update: failed (nothing changed the weights) or blocked (an
    optimizer step may have: the update stays unresolved and nobody holds it)."""
    client_forget(trainer.run_id)  # the run will not continue: free the trainer's memory
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
        _run_end(
            run=Run.objects.select_related("org").get(pk=trainer.run_id),
            error=error,
            summary=training_summary(run_id=trainer.run_id),
        )


def update_apply(*, run_id: str, step: int) -> LearningUpdate | None:
    """Apply the learning update of ``step`` (the trainer must be ``updating``). Safe to
    deliver twice: one process holds the update at a time, the others return."""
    trainer = Trainer.objects.select_related("run__spec", "run__org").get(run_id=run_id)
    if trainer.status != TrainerStatus.UPDATING or trainer.step != step:
        return None
    update, _ = LearningUpdate.objects.get_or_create(run=trainer.run, step=step, defaults={"sampler": trainer.sampler})
    if update.status == UpdateStatus.UNRESOLVED:
        if not holder_gone(update=update, now=timezone.now()):
            return None  # a live process is applying it (this is a second delivery)
        # A previous attempt died between the optimizer step and the saved checkpoint.
        update_fail(
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


def _gathered(*, contributions: list[GroupContribution]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the update's record of its groups, its metrics so far) from its contributions."""
    included = [c for c in contributions if c.status != ContributionStatus.EXCLUDED]
    rewards = [r for c in contributions for r in (c.summary or {}).get("rewards", [])]
    gathered = {
        "groups": [
            {
                **(c.summary or {"group": c.group_id}),
                "skipped": c.reason or None,
                "sampler_step": c.sampler_step,
                "staleness": c.staleness,
            }
            for c in contributions
        ],
        "datums": sum(c.datums for c in included),
        "sampled_tokens": sum(c.sampled_tokens for c in included),
    }
    metrics: dict[str, Any] = {
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "attempts_qualified": len(rewards),
        "groups_used": len(included),
        "groups_skipped": len(contributions) - len(included),
        "groups_stale": sum(1 for c in contributions if c.status == ContributionStatus.EXCLUDED and not c.summary),
        "attempts_truncated": sum(
            1 for c in contributions for why in ((c.summary or {}).get("excluded") or {}).values() if why == TRUNCATED
        ),
    }
    return gathered, metrics


def _kl_metrics(*, contributions: list[GroupContribution]) -> dict[str, Any]:
    """kl_sample_train over the update's trained tokens, and by the staleness of the groups."""
    by: dict[int, list[float]] = {}
    for c in contributions:
        if c.status == ContributionStatus.SUBMITTED and c.metrics.get("kl_tokens"):
            terms = by.setdefault(c.staleness, [0.0, 0.0])
            terms[0] += float(c.metrics["kl_sum"])
            terms[1] += float(c.metrics["kl_tokens"])
    total = sum(t[0] for t in by.values())
    tokens = sum(t[1] for t in by.values())
    return {
        "kl_sample_train": total / tokens if tokens else None,
        "kl_sample_train_by_staleness": {str(k): t[0] / t[1] for k, t in sorted(by.items())},
        "staleness_max": max((c.staleness for c in contributions if c.status != "excluded"), default=0),
    }


def _update_run(*, trainer: Trainer, update: LearningUpdate, holder: str) -> LearningUpdate:
    run = trainer.run
    plan = run.spec.plan
    step = update.step
    started = time.monotonic()
    try:
        # Groups whose contribution was not recorded as they settled (a lost message, a
        # dead feeder) are recorded now; the others were, by pipeline.step_feed.
        recorded = contributions_record(update=update, plan=plan)
    except Exception as exc:  # noqa: BLE001 - any failure to gather data ends the run clearly
        logger.exception("gathering the data of %s step %s failed", run.id, step)
        update_fail(update=update, trainer=trainer, error=f"gathering step {step}'s data failed: {exc}", blocked=False)
        return update
    contributions = [r.contribution for r in recorded]
    gathered, metrics = _gathered(contributions=contributions)
    metrics["gather_seconds"] = round(time.monotonic() - started, 3)
    if not gathered["datums"]:
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
                transaction.on_commit(lambda: client_skip(run_id=run.id, step=step + 1))
        return update

    with client_lock(run.id):
        return _update_train(
            trainer=trainer, update=update, holder=holder, recorded=recorded, gathered=gathered, metrics=metrics
        )


def _update_train(
    *,
    trainer: Trainer,
    update: LearningUpdate,
    holder: str,
    recorded: list[Recorded],
    gathered: dict[str, Any],
    metrics: dict[str, Any],
) -> LearningUpdate:
    """Submit what this process' client lacks, step the optimizer, save, record the
    checkpoint. Caller holds the run's client lock."""
    from tinker import types

    run = trainer.run
    plan = run.spec.plan
    step = update.step
    try:
        started = time.monotonic()
        live = live_client(trainer=trainer, plan=plan)
        if live.step != step:
            raise RuntimeError(f"the trainer's saved weights are of step {live.step}, not {step}")
        t0 = time.monotonic()
        metrics["client_seconds"] = round(t0 - started, 3)  # 0 when the feeder's client is reused
        resubmitted = 0
        for item in recorded:
            if item.contribution.status in INCLUDED:
                resubmitted += contribution_submit(live=live, recorded=item, plan=plan, holder=holder)
    except Exception as exc:  # noqa: BLE001 - nothing changed the weights yet
        logger.exception("the forward/backward of %s step %s failed", run.id, step)
        client_forget(run.id)
        update_fail(update=update, trainer=trainer, error=f"the update of step {step} failed: {exc}", blocked=False)
        return update
    contributions = [r.contribution for r in recorded]
    # The optimizer step changes weights the database cannot see: record that it is in flight.
    if not update_transition(
        update=update,
        to=UpdateStatus.UNRESOLVED,
        event="training.update_submitted",
        data={"datums": gathered["datums"], "sampled_tokens": gathered["sampled_tokens"]},
        values=gathered,
        holder=holder,
    ):
        logger.warning("the update of %s step %s was taken over before its optimizer step", run.id, step)
        return update
    try:
        optim_out = live.client.optim_step(
            types.AdamParams(learning_rate=float(plan["learning_rate"]), beta1=0.9, beta2=0.95, eps=1e-8)
        ).result()
        live.step, live.keys = step + 1, set()
        t2 = time.monotonic()
        name = f"{step + 1:06d}"
        # Both saves are queued at once: the sampler weights are packed and stored while the
        # trainer still writes its state (a backend runs its calls in submission order).
        sampler_saved = live.client.save_weights_for_sampler(name)
        state_saved = live.client.save_state(name)
        snapshot, sha256, size = weights_persist(run=run, path=sampler_saved.result().path)
        state_ref, _, _ = weights_persist(run=run, path=state_saved.result().path)
        t3 = time.monotonic()
    except Exception as exc:  # noqa: BLE001 - the weights may or may not have changed
        logger.exception("the update of %s step %s failed", run.id, step)
        client_forget(run.id)
        update_fail(update=update, trainer=trainer, error=f"the update of step {step} failed: {exc}", blocked=True)
        return update
    losses = [c.metrics.get("loss") for c in contributions if c.status == ContributionStatus.SUBMITTED]
    metrics.update(
        {
            "loss_sum": sum(v for v in losses if v is not None),
            "grad_norm": (optim_out.metrics or {}).get("optim/grad_norm"),
            **_kl_metrics(contributions=contributions),
            # Forward/backward left for the optimizer step (the rest ran as groups settled).
            "groups_submitted_late": resubmitted,
            "train_seconds": round(t2 - t0, 3),  # the late forward/backward and the optimizer step
            "save_seconds": round(t3 - t2, 3),
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
            milestone=(step + 1) % int(plan.get("save_every", 5)) == 0
            or step + 1 >= trainer_end_step(trainer=trainer, plan=plan),
            resume=checkpoint_resume(run=run, trainer=trainer, plan=plan),
        )
        if not update_transition(
            update=update,
            to=UpdateStatus.APPLIED,
            event="training.update_applied",
            data={"datums": gathered["datums"], **metrics},
            values={"metrics": metrics, "checkpoint": checkpoint},
            holder=holder,
        ):
            # The sweeper blocked the run meanwhile (this process' heartbeat lapsed): the
            # run has ended, so these weights are not recorded as its progress.
            logger.warning("the update of %s step %s was blocked before it was confirmed", run.id, step)
            transaction.set_rollback(True)
            client_forget(run.id)
            return update
        trainer.sampler = checkpoint.binding()
        trainer.state_path = state_ref
        trainer.save(update_fields=["sampler", "state_path", "updated_at"])
        event_append(
            run_id=run.id,
            type="checkpoint.saved",
            data={"checkpoint": checkpoint.id, "step": checkpoint.step, "snapshot": snapshot, "sha256": sha256},
        )
        client_state_note(run_id=run.id, state_path=state_ref, step=step + 1)
        _advance(run_id=run.id)
    return update


def _advance(*, run_id: str) -> None:
    """After an update: the next batch, or the end of the run. Caller is in a transaction."""
    run = Run.objects.select_for_update(no_key=True, of=("self",)).select_related("spec").get(pk=run_id)
    trainer = Trainer.objects.select_for_update(no_key=True).get(run=run)
    trainer.step += 1
    # A skipped update kept the weights: they are those of this step too.
    trainer.sampler_step = trainer.step
    trainer.save(update_fields=["step", "sampler_step", "updated_at"])
    ended = trainer.step >= trainer_end_step(trainer=trainer, plan=run.spec.plan)
    if ended or run.cancel_requested_at is not None or run.is_terminal:
        trainer_transition(trainer=trainer, to=TrainerStatus.DONE, event="training.done")
        transaction.on_commit(lambda: client_forget(run_id))
        if not run.is_terminal:
            _run_end(run=run, summary=training_summary(run_id=run_id))
        return
    trainer_transition(
        trainer=trainer, to=TrainerStatus.SAMPLING, event="training.sampling", data={"sampler": trainer.sampler}
    )
    try:
        started = batch_start(run=run, trainer=trainer)
    except TrainingFailed as exc:
        trainer_transition(trainer=trainer, to=TrainerStatus.FAILED, event="training.failed", data={"error": str(exc)})
        _run_end(run=run, error=str(exc), summary=training_summary(run_id=run_id))
        return
    if not started:
        # The batch started early (max_staleness > 0) and may have settled meanwhile: feed it.
        from apps.training.tasks import group_settled_task

        step = trainer.step
        transaction.on_commit(lambda: group_settled_task.delay(run_id, step))


def _run_end(*, run: Run, summary: dict[str, Any], error: str = "") -> None:
    """End the train run; attempts of a batch started early that are still live are
    cancelled first (the run then ends when they stop, cancelled, with ``error``)."""
    if run.trials.filter(status__in=LIVE_TRIAL).exists():
        run_cancel(org=run.org, run_id=run.id, reason=error or "the train run ended")
        return
    run_complete(run_id=run.id, error=error, extra_summary=summary)


def training_summary(*, run_id: str) -> dict[str, Any]:
    """The train run's learning, for its summary, by step: reward_by_step[N] is the mean
    reward of the groups sampled at step first_step + N (0 unless the run continues a
    checkpoint: updates and checkpoints number steps on from it), and checkpoints are in
    step order."""
    # An update still pending when the run ends (of a batch started early) did not happen.
    updates = list(LearningUpdate.objects.filter(run_id=run_id).exclude(status=UpdateStatus.PENDING).order_by("step"))
    checkpoints = list(Checkpoint.objects.filter(run_id=run_id).order_by("step").values_list("id", flat=True))
    first_step = Trainer.objects.filter(run_id=run_id).values_list("first_step", flat=True).first() or 0
    replacements = replacements_summary(run_id=run_id)
    return {
        "training": {
            "first_step": first_step,
            "steps": len(updates),
            "applied": sum(1 for u in updates if u.status == UpdateStatus.APPLIED),
            "skipped": sum(1 for u in updates if u.status == UpdateStatus.SKIPPED),
            "reward_by_step": [u.metrics.get("reward_mean") for u in updates],
            # Dynamic sampling: groups replaced for want of signal, attempts left out as cut.
            "groups_replaced": len(replacements),
            "replacements": replacements,
            "attempts_truncated": sum(int(u.metrics.get("attempts_truncated") or 0) for u in updates),
            "checkpoints": checkpoints,
            "final_checkpoint": checkpoints[-1] if checkpoints else None,
        }
    }
