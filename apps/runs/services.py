"""Writes for runs: admission, events, cancellation, leases and the reaper.

Lock order everywhere: a worker node's row (admission only) first, then the Run row, then
its Lease rows, then its trials, groups and reservations. Every event append takes the run
row's lock (it bumps `last_event_seq`), so events of one run commit in sequence order and a
reader never sees seq N+1 before seq N. Status changes go through apps.runs.transitions
(claims, each with its event). A heartbeat takes no run lock: it is one conditional UPDATE
of its lease, so it never waits behind a cancel or a settlement of the run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from apps.accounts.models import Organization, WorkerIdentity
from apps.core.errors import Conflict, NotFound, StaleLease, ValidationFailed
from apps.datasets.services import dataset_version_local_check, dataset_version_resolve
from apps.profiles.models import ProfileVersion
from apps.profiles.selectors import profile_version_get, profile_version_recipe
from apps.runs.bindings import model_binding_resolve
from apps.runs.events import event_append, events_append
from apps.runs.models import (
    TERMINAL_STATUSES,
    Artifact,
    Lease,
    LeaseStatus,
    LeaseWrite,
    Run,
    RunKind,
    RunSpec,
    RunStatus,
)
from apps.runs.plans import plan_normalize, plan_uses_local_sandbox
from apps.runs.transitions import lease_transition, run_transition
from synth_common.canonical import canonical_digest

logger = logging.getLogger(__name__)

__all__ = ["event_append", "events_append"]  # re-exported: the events API callers know

# Event types a worker may append through its lease; lifecycle events are the platform's.
WORKER_EVENT_PREFIXES = (
    "progress.",
    "group.",
    "trial.",
    "admission.",
    "artifact.",
    "log.",
)

# A cancel settles this many not-started trials in the caller (each batch its own short
# transaction); the control queue settles the rest (runs.cancel_settle), the sweeper
# finishes what a lost message left.
CANCEL_INLINE_BATCHES = 4


# --------------------------------------------------------------------------- admission


@dataclass(frozen=True)
class ProfileRef:
    name: str
    version: int | None
    digest: str | None


def _profile_ref(value: Any, *, field: str) -> ProfileRef | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("profile"), str) or not value["profile"]:
        raise ValidationFailed(f'{field} must be {{"profile": NAME, "version": N}}', field=field)
    extra = set(value) - {"profile", "version", "digest"}
    if extra:
        raise ValidationFailed(
            f"{field}: unknown field {sorted(extra)[0]!r}",
            field=f"{field}.{sorted(extra)[0]}",
        )
    version = value.get("version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
        raise ValidationFailed(f"{field}.version must be a positive integer", field=f"{field}.version")
    digest = value.get("digest")
    if digest is not None:
        if not isinstance(digest, str):
            raise ValidationFailed(f"{field}.digest must be a string", field=f"{field}.digest")
        digest = digest.removeprefix("sha256:")
    return ProfileRef(name=value["profile"], version=version, digest=digest)


def run_request_normalize(*, body: Any) -> dict[str, Any]:
    """The submission body in one canonical shape; its digest identifies the request."""
    if not isinstance(body, dict):
        raise ValidationFailed("the request body must be a JSON object")
    allowed = {"kind", "dataset", "actor", "judge", "plan"}
    extra = set(body) - allowed
    if extra:
        name = sorted(extra)[0]
        raise ValidationFailed(f"unknown field {name!r}", field=name)
    kind = body.get("kind")
    if kind not in RunKind.values:
        raise ValidationFailed(f"kind must be one of {', '.join(RunKind.values)}", field="kind")
    dataset = body.get("dataset")
    if not isinstance(dataset, str) or not dataset:
        raise ValidationFailed("dataset must be a reference ORG/NAME@VERSION", field="dataset")
    if body.get("actor") is None:
        raise ValidationFailed("actor is required", field="actor")
    actor = _profile_ref(body.get("actor"), field="actor")
    judge = _profile_ref(body.get("judge"), field="judge")
    return {
        "kind": kind,
        "dataset": dataset,
        "actor": actor.__dict__ if actor else None,
        "judge": judge.__dict__ if judge else None,
        "plan": plan_normalize(kind=kind, plan=body.get("plan")),
    }


def _resolve_profile(*, org: Organization, ref: ProfileRef, field: str) -> ProfileVersion:
    if ref.version is None:
        from apps.profiles.selectors import profile_version_latest

        version = profile_version_latest(org=org, name=ref.name)
    else:
        version = profile_version_get(org=org, name=ref.name, version=ref.version)
    if ref.digest is not None and ref.digest != version.digest:
        raise Conflict(
            f"{field}: {ref.name}@{version.version} has digest sha256:{version.digest}, not sha256:{ref.digest}",
            field=f"{field}.digest",
        )
    return version


def _existing_run(*, org: Organization, idempotency_key: str, request_digest: str) -> Run | None:
    run = Run.objects.filter(org=org, idempotency_key=idempotency_key).first()
    if run is not None and run.request_digest != request_digest:
        raise Conflict(
            "Idempotency-Key was already used for a different request body",
            field="Idempotency-Key",
        )
    return run


def _trainable_check(*, binding: dict[str, Any]) -> None:
    """A train run must bind a model route that exists and may be trained: refused at
    submission rather than failing once admitted."""
    from apps.trials.model_access import model_route_get  # lazy: runs' models do not depend on the proxy

    name = binding.get("route")
    if not name:
        raise ValidationFailed("a train run's actor must bind a model (a route or a checkpoint)", field="actor.model")
    route = model_route_get(name=name)
    if route is None:
        raise ValidationFailed(f"model route {name!r} does not exist", field="actor.model.route")
    if not route.trainable:
        raise ValidationFailed(f"model route {name!r} is not trainable", field="actor.model.route")


def _regrade_source_check(*, org: Organization, source_id: str, judge: ProfileVersion | None) -> None:
    if judge is None:
        raise ValidationFailed("a regrade needs a judge", field="judge")
    source = Run.objects.filter(org=org, pk=source_id).first()
    if source is None:
        raise NotFound(f"run {source_id} not found", field="plan.source_run")
    if not source.is_terminal:
        raise Conflict(f"run {source_id} is {source.status}; regrade it once it has ended", field="plan.source_run")
    if not Artifact.objects.filter(run=source, kind="work").exists():
        raise Conflict(
            f"run {source_id} retained no outputs to re-assess (its attempts' workdirs were not kept: "
            "plan.retain_workdir)",
            field="plan.source_run",
        )


def run_regrade(
    *, org: Organization, user: AbstractBaseUser | None, run_id: str, idempotency_key: str, body: Any
) -> tuple[Run, bool]:
    """Re-assess a finished run's retained outputs with a judge: a new run of kind regrade
    on the same dataset version and actor, one trial per retained attempt. ``body`` is
    ``{"judge": <profile ref>, "plan": {...}}`` (plan optional). Idempotent like run_submit."""
    if not isinstance(body, dict):
        raise ValidationFailed("the request body must be a JSON object")
    extra = set(body) - {"judge", "plan"}
    if extra:
        raise ValidationFailed(f"unknown field {sorted(extra)[0]!r}", field=sorted(extra)[0])
    source = Run.objects.select_related("spec__actor_version__profile").filter(org=org, pk=run_id).first()
    if source is None:
        raise NotFound(f"run {run_id} not found")
    plan = body.get("plan") or {}
    if not isinstance(plan, dict):
        raise ValidationFailed("plan must be a JSON object", field="plan")
    if plan.get("source_run", run_id) != run_id:
        raise ValidationFailed("plan.source_run must be the run being regraded", field="plan.source_run")
    actor = source.spec.actor_version
    submission = {
        "kind": RunKind.REGRADE.value,
        "dataset": source.spec.dataset_ref,
        "actor": {"profile": actor.profile.name, "version": actor.version},
        "judge": body.get("judge"),
        "plan": {**plan, "source_run": run_id},
    }
    return run_submit(org=org, user=user, idempotency_key=idempotency_key, body=submission)


def run_submit(
    *,
    org: Organization,
    user: AbstractBaseUser | None,
    idempotency_key: str,
    body: Any,
) -> tuple[Run, bool]:
    """Admit a run: resolve and pin its inputs, then write Run, RunSpec and `run.created`
    in one transaction. Returns (run, created). Same key + same body returns the first
    run; same key + another body is a Conflict."""
    if not idempotency_key or len(idempotency_key) > 200:
        raise ValidationFailed("Idempotency-Key must be 1-200 characters", field="Idempotency-Key")
    request = run_request_normalize(body=body)
    request_digest = canonical_digest(request)

    existing = _existing_run(org=org, idempotency_key=idempotency_key, request_digest=request_digest)
    if existing is not None:
        return existing, False

    dataset_version = dataset_version_resolve(org=org, reference=request["dataset"])
    if plan_uses_local_sandbox(plan=request["plan"]):
        dataset_version_local_check(dataset_version=dataset_version, task_names=request["plan"].get("task_names"))
    actor = _resolve_profile(org=org, ref=ProfileRef(**request["actor"]), field="actor")
    judge = _resolve_profile(org=org, ref=ProfileRef(**request["judge"]), field="judge") if request["judge"] else None
    if request["kind"] == RunKind.REGRADE:
        _regrade_source_check(org=org, source_id=request["plan"]["source_run"], judge=judge)
    recipe = profile_version_recipe(profile_version=actor)
    model_binding = model_binding_resolve(org=org, binding=recipe.get("model") or {})
    if request["kind"] == RunKind.TRAIN:
        _trainable_check(binding=model_binding)
    # The judge's weights are pinned too (a checkpoint judge is resolved now, not per trial).
    judge_binding = None
    if judge is not None:
        judge_model = profile_version_recipe(profile_version=judge).get("model")
        judge_binding = model_binding_resolve(org=org, binding=judge_model, field="judge") if judge_model else None

    try:
        with transaction.atomic():
            run = Run.objects.create(
                org=org,
                created_by=user,
                kind=request["kind"],
                idempotency_key=idempotency_key,
                request_digest=request_digest,
            )
            RunSpec.objects.create(
                run=run,
                dataset_version=dataset_version,
                dataset_ref=dataset_version.reference,
                dataset_digest=dataset_version.digest,
                actor_version=actor,
                actor_digest=actor.digest,
                judge_version=judge,
                judge_digest=judge.digest if judge else "",
                model_binding=model_binding,
                judge_binding=judge_binding,
                plan=request["plan"],
            )
            event_append(
                run_id=run.id,
                type="run.created",
                data={
                    "kind": run.kind,
                    "dataset": dataset_version.reference,
                    "dataset_digest": dataset_version.digest,
                    "tasks": dataset_version.task_count,
                    "actor": {
                        "profile": actor.profile.name,
                        "version": actor.version,
                        "digest": actor.digest,
                    },
                    "judge": (
                        {
                            "profile": judge.profile.name,
                            "version": judge.version,
                            "digest": judge.digest,
                        }
                        if judge
                        else None
                    ),
                },
            )
            from apps.runs.tasks import run_schedule_task

            transaction.on_commit(lambda: run_schedule_task.delay(run.id))
    except IntegrityError:
        # A concurrent submission with the same key won the unique constraint.
        existing = _existing_run(org=org, idempotency_key=idempotency_key, request_digest=request_digest)
        if existing is None:
            raise
        return existing, False
    return run, True


def run_schedule(*, run_id: str) -> Run:
    """Move an admitted run to `queued` once its prerequisites are durably ready.

    Prerequisites: the pinned spec is committed (it is, since this runs after commit)
    and every task package of the dataset version is a committed, verified object.
    """
    with transaction.atomic():
        run = Run.objects.select_for_update(of=("self",)).select_related("spec").get(pk=run_id)
        if run.status != RunStatus.ACCEPTED:
            return run  # already scheduled, cancelled, ...: nothing to do (safe to run twice)
        missing = run.spec.dataset_version.entries.filter(task_version__archive__isnull=True).count()
        if missing:
            error = f"{missing} task packages are not in the object store"
            run_transition(
                run=run, to=RunStatus.FAILED, event="run.failed", data={"error": error}, values={"error": error}
            )
            return run
        run_transition(run=run, to=RunStatus.QUEUED, event="run.queued")
        from apps.runs.tasks import run_dispatch_task

        transaction.on_commit(lambda: run_dispatch_task.delay(run.id))
    return run


def _cancel_mark(*, run: Run, reason: str) -> bool:
    """The cancel's one short transaction. True if the run is now cancelling (its trials
    still to settle); False if it ended here or had ended or was cancelling already."""
    now = timezone.now()
    # The run may move between the read and the claim (dispatched, claimed): then the claim
    # fails and the next round tries the move that fits its new status.
    for _ in range(3):
        status = Run.objects.filter(pk=run.id).values_list("status", flat=True).get()
        if status in TERMINAL_STATUSES or status == RunStatus.CANCELLING:
            return False
        if status == RunStatus.RUNNING:
            if run_transition(
                run=run,
                to=RunStatus.CANCELLING,
                source={RunStatus.RUNNING},
                event="run.cancel_requested",
                data={"reason": reason},
                values={"cancel_requested_at": now},
            ):
                return True
        elif run_transition(
            run=run,
            to=RunStatus.CANCELLED,
            source={RunStatus.ACCEPTED, RunStatus.QUEUED},
            event="run.cancelled",
            data={"reason": reason},
            values={"cancel_requested_at": now},
        ):
            return False
    raise Conflict(f"run {run.id} kept changing status; cancel it again")


def run_cancel(*, org: Organization, run_id: str, reason: str = "cancelled by operator") -> Run:
    """Cancel a run. Unclaimed runs end at once. A running run becomes `cancelling` in one
    short transaction; its trials that have not started are then settled in batches, each
    its own short transaction (a few here, the rest by the control queue); running trials
    keep their leases and learn of it at their next heartbeat. The run ends `cancelled`
    when its last trial ends."""
    run = Run.objects.filter(org=org, pk=run_id).first()
    if run is None:
        raise NotFound(f"run {run_id} not found")
    if _cancel_mark(run=run, reason=reason):
        from apps.runs.execution import run_cancel_settle

        if not run_cancel_settle(run_id=run.id, max_batches=CANCEL_INLINE_BATCHES):
            from apps.runs.tasks import run_cancel_settle_task

            transaction.on_commit(lambda: run_cancel_settle_task.delay(run.id))
    run.refresh_from_db()
    return run


# --------------------------------------------------------------------------- leases


def _lease_ttl() -> timedelta:
    return timedelta(seconds=settings.SYNTH_LEASE_TTL_SECONDS)


def lease_claim(*, worker: WorkerIdentity, unit: str = "run") -> Lease | None:
    """Claim the oldest queued run this worker may serve; None when there is none."""
    now = timezone.now()
    with transaction.atomic():
        candidates = Run.objects.filter(status=RunStatus.QUEUED)
        if worker.org_id is not None:
            candidates = candidates.filter(org_id=worker.org_id)
        # SKIP LOCKED: concurrent claimers take different runs instead of queueing behind
        # one another (a no-op on SQLite, where writers are serialized anyway).
        run = candidates.select_for_update(skip_locked=True).order_by("id").first()
        if run is None:
            return None
        fence = (Lease.objects.filter(run=run, unit=unit).aggregate(m=Max("fence"))["m"] or 0) + 1
        lease = Lease.objects.create(
            run=run,
            unit=unit,
            worker=worker,
            fence=fence,
            heartbeat_at=now,
            expires_at=now + _lease_ttl(),
        )
        first_start = run.started_at is None
        run_transition(
            run=run,
            to=RunStatus.RUNNING,
            source={RunStatus.QUEUED},
            event="lease.acquired",
            data={"lease": lease.id, "unit": unit, "fence": fence, "worker": worker.name},
        )
        if first_start:
            event_append(run_id=run.id, type="run.started", data={})
    return lease


def _locked_active_lease(*, lease_id: str, fence: int, worker: WorkerIdentity) -> tuple[Run, Lease]:
    """Lock run then lease and check that the caller holds the active lease at `fence`."""
    lease = Lease.objects.filter(pk=lease_id, worker=worker).only("run_id").first()
    if lease is None:
        raise NotFound(f"lease {lease_id} not found")
    run = Run.objects.select_for_update().get(pk=lease.run_id)
    lease = Lease.objects.select_for_update().get(pk=lease_id)
    _lease_check(lease=lease, fence=fence)
    return run, lease


def _lease_check(*, lease: Lease, fence: int) -> None:
    if lease.fence != fence:
        raise StaleLease(
            f"fence {fence} does not match lease {lease.id} (fence {lease.fence})",
            field="fence",
        )
    if lease.status != LeaseStatus.ACTIVE:
        raise StaleLease(f"lease {lease.id} is {lease.status}; a newer holder may own this work")
    if lease.expires_at <= timezone.now():
        raise StaleLease(f"lease {lease.id} expired at {lease.expires_at.isoformat()}")


@dataclass(frozen=True)
class HeartbeatResult:
    expires_at: Any
    cancel_requested: bool


def lease_heartbeat(*, worker: WorkerIdentity, lease_id: str, fence: int) -> HeartbeatResult:
    """Extend the caller's live lease. One conditional UPDATE of the lease row and no run
    lock: a heartbeat never queues behind a cancel or a settlement of the same run. The
    reaper expires a lease under that row's lock, so the two cannot both win."""
    now = timezone.now()
    expires_at = now + _lease_ttl()
    extended = Lease.objects.filter(
        pk=lease_id, worker=worker, fence=fence, status=LeaseStatus.ACTIVE, expires_at__gt=now
    ).update(heartbeat_at=now, expires_at=expires_at)
    if not extended:
        lease = Lease.objects.filter(pk=lease_id, worker=worker).first()
        if lease is None:
            raise NotFound(f"lease {lease_id} not found")
        _lease_check(lease=lease, fence=fence)
        raise StaleLease(f"lease {lease.id} could not be extended")  # it changed between the two reads
    cancel_requested = Run.objects.filter(leases__pk=lease_id, cancel_requested_at__isnull=False).exists()
    return HeartbeatResult(expires_at=expires_at, cancel_requested=cancel_requested)


def lease_report(
    *,
    worker: WorkerIdentity,
    lease_id: str,
    fence: int,
    local_seq: int,
    events: list[dict[str, Any]],
) -> bool:
    """Apply a progress write under the lease. Returns False when (lease, local_seq) was
    already applied: a retried write is acknowledged, not repeated."""
    for i, event in enumerate(events):
        etype = event.get("type") if isinstance(event, dict) else None
        if not isinstance(etype, str) or not etype.startswith(WORKER_EVENT_PREFIXES):
            raise ValidationFailed(
                f"events[{i}].type must start with one of {', '.join(WORKER_EVENT_PREFIXES)}",
                field=f"events[{i}].type",
            )
        if not isinstance(event.get("data", {}), dict):
            raise ValidationFailed(f"events[{i}].data must be an object", field=f"events[{i}].data")
    with transaction.atomic():
        run, lease = _locked_active_lease(lease_id=lease_id, fence=fence, worker=worker)
        if LeaseWrite.objects.filter(lease=lease, local_seq=local_seq).exists():
            return False
        LeaseWrite.objects.create(lease=lease, local_seq=local_seq)
        for event in events:
            event_append(run_id=run.id, type=event["type"], data=event.get("data") or {})
    return True


def lease_complete(
    *,
    worker: WorkerIdentity,
    lease_id: str,
    fence: int,
    outcome: str,
    summary: dict[str, Any] | None = None,
    error: str = "",
) -> Run:
    """End the run under its active lease: both move together in one transaction."""
    if outcome not in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED):
        raise ValidationFailed("outcome must be succeeded, failed or cancelled", field="outcome")
    with transaction.atomic():
        run, lease = _locked_active_lease(lease_id=lease_id, fence=fence, worker=worker)
        if lease.unit.startswith("trial:"):
            raise Conflict(f"lease {lease.id} holds one trial: it ends with that trial, not with the run")
        lease_transition(lease=lease, to=LeaseStatus.COMPLETED, event="lease.completed")
        summary = summary or {}
        run_transition(
            run=run,
            to=outcome,
            source={RunStatus.RUNNING, RunStatus.CANCELLING},
            event=f"run.{outcome}",
            data={"summary": summary, "error": error or None},
            values={"summary": summary, "error": error},
        )
    return run


def lease_release(*, worker: WorkerIdentity, lease_id: str, fence: int, reason: str = "") -> Run:
    """Give the work back (e.g. a worker shutting down): the run is queued again."""
    with transaction.atomic():
        run, lease = _locked_active_lease(lease_id=lease_id, fence=fence, worker=worker)
        lease_transition(lease=lease, to=LeaseStatus.RELEASED, event="lease.released", data={"reason": reason})
        _work_return(run=run, lease=lease, why="its lease was released")
    return run


def _work_return(*, run: Run, lease: Lease, why: str) -> None:
    """What a lease held goes back when the lease ends without an outcome: its reservations
    are released, a trial is requeued (or lost, or cancelled), a whole run queued again."""
    from apps.trials.admission import reservations_release

    reservations_release(lease=lease, why=why)
    if lease.unit.startswith("trial:"):
        from apps.runs.execution import trial_lease_lapsed

        trial_lease_lapsed(run=run, lease=lease)
    else:
        _return_to_queue(run=run)


def _return_to_queue(*, run: Run) -> None:
    """A whole-run lease ended without an outcome: queue the run again, or end it if a
    cancel was requested meanwhile. Caller holds the run lock."""
    if run.cancel_requested_at is not None:
        run_transition(
            run=run,
            to=RunStatus.CANCELLED,
            source={RunStatus.CANCELLING},
            event="run.cancelled",
            data={"reason": "cancelled while its holder was gone"},
        )
    else:
        run_transition(run=run, to=RunStatus.QUEUED, source={RunStatus.RUNNING}, event="run.requeued")


def lease_lapse(*, run: Run, lease: Lease, now: Any) -> bool:
    """Expire a lapsed lease with what it held, in the caller's transaction: its
    reservations are released, and its work is requeued, lost or cancelled. False if the
    lease was not lapsed (its holder heartbeated or ended it meanwhile). Caller holds the
    run and lease locks."""
    if not lease_transition(
        lease=lease,
        to=LeaseStatus.EXPIRED,
        event="lease.expired",
        data={"reason": "no heartbeat"},
        where={"expires_at__lte": now},
    ):
        return False
    # A trial's worker vanished: retry or lose the trial, per the plan.
    _work_return(run=run, lease=lease, why="its lease expired")
    return True


def leases_reap(*, now: Any = None, limit: int = 500) -> list[tuple[str, str]]:
    """Expire lapsed leases and return their work to the queue; returns the (run, lease)
    pairs reaped. Safe to run concurrently (each lease is re-checked under its lock)."""
    now = now or timezone.now()
    reaped = []
    lapsed = list(
        Lease.objects.filter(status=LeaseStatus.ACTIVE, expires_at__lte=now)
        .order_by("expires_at")
        .values_list("id", "run_id")[:limit]
    )
    for lease_id, run_id in lapsed:
        with transaction.atomic():
            run = Run.objects.select_for_update(of=("self",)).select_related("spec").get(pk=run_id)
            lease = Lease.objects.select_for_update().get(pk=lease_id)
            if lease_lapse(run=run, lease=lease, now=now):
                reaped.append((run_id, lease_id))
    if reaped:
        logger.info("reaped %d lapsed leases", len(reaped))
    return reaped


def lease_reap(*, now: Any = None) -> int:
    return len(leases_reap(now=now))
