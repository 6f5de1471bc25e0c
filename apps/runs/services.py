"""Writes for runs: admission, events, cancellation, leases and the reaper.

Lock order everywhere: the Run row first, then its Lease rows. Every event append
takes the run row's lock (it bumps `last_event_seq`), so events of one run commit in
sequence order and a reader never sees seq N+1 before seq N.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import F, Max
from django.utils import timezone

from apps.accounts.models import Organization, WorkerIdentity
from apps.core.canonical import canonical_digest
from apps.core.errors import Conflict, NotFound, StaleLease, ValidationFailed
from apps.datasets.services import dataset_version_local_check, dataset_version_resolve
from apps.profiles.models import ProfileVersion
from apps.profiles.selectors import profile_version_get, profile_version_recipe
from apps.runs.bindings import model_binding_resolve
from apps.runs.models import (
    TERMINAL_STATUSES,
    Artifact,
    Lease,
    LeaseStatus,
    LeaseWrite,
    Run,
    RunEvent,
    RunKind,
    RunSpec,
    RunStatus,
)
from apps.runs.plans import plan_normalize, plan_uses_local_sandbox

logger = logging.getLogger(__name__)

# Event types a worker may append through its lease; lifecycle events are the platform's.
WORKER_EVENT_PREFIXES = (
    "progress.",
    "group.",
    "trial.",
    "admission.",
    "artifact.",
    "log.",
)


# --------------------------------------------------------------------------- events


def event_append(*, run_id: str, type: str, data: dict[str, Any] | None = None) -> RunEvent:
    """Append the run's next event. Must run inside the caller's transaction."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("event_append must be called inside transaction.atomic()")
    # The UPDATE takes the run row's lock until commit: sequence numbers are gap-free
    # and commit in order (see the module docstring).
    updated = Run.objects.filter(pk=run_id).update(last_event_seq=F("last_event_seq") + 1)
    if updated != 1:
        raise NotFound(f"run {run_id} not found")
    seq = Run.objects.filter(pk=run_id).values_list("last_event_seq", flat=True).get()
    return RunEvent.objects.create(run_id=run_id, seq=seq, type=type, data=data or {})


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
    from apps.runs.model_access import model_route_get  # lazy: runs' models do not depend on the proxy

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
            run.status = RunStatus.FAILED
            run.error = f"{missing} task packages are not in the object store"
            run.finished_at = timezone.now()
            run.save(update_fields=["status", "error", "finished_at", "updated_at"])
            event_append(run_id=run.id, type="run.failed", data={"error": run.error})
            return run
        run.status = RunStatus.QUEUED
        run.save(update_fields=["status", "updated_at"])
        event_append(run_id=run.id, type="run.queued", data={})
        from apps.runs.tasks import run_dispatch_task

        transaction.on_commit(lambda: run_dispatch_task.delay(run.id))
    return run


def run_cancel(*, org: Organization, run_id: str, reason: str = "cancelled by operator") -> Run:
    """Cancel a run. Unclaimed runs end at once; a running run moves to `cancelling` and
    its lease holder learns it at its next heartbeat, then completes as cancelled."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(org=org, pk=run_id).first()
        if run is None:
            raise NotFound(f"run {run_id} not found")
        if run.status in TERMINAL_STATUSES or run.status == RunStatus.CANCELLING:
            return run
        now = timezone.now()
        run.cancel_requested_at = now
        if run.status == RunStatus.RUNNING:
            run.status = RunStatus.CANCELLING
            run.save(update_fields=["status", "cancel_requested_at", "updated_at"])
            event_append(run_id=run.id, type="run.cancel_requested", data={"reason": reason})
            from apps.runs.execution import run_cancel_trials

            # Trials that have not started end now; running ones learn it by heartbeat.
            run_cancel_trials(run=run)
        else:
            run.status = RunStatus.CANCELLED
            run.finished_at = now
            run.save(
                update_fields=[
                    "status",
                    "cancel_requested_at",
                    "finished_at",
                    "updated_at",
                ]
            )
            event_append(run_id=run.id, type="run.cancelled", data={"reason": reason})
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
        run.status = RunStatus.RUNNING
        run.started_at = run.started_at or now
        run.save(update_fields=["status", "started_at", "updated_at"])
        event_append(
            run_id=run.id,
            type="lease.acquired",
            data={
                "lease": lease.id,
                "unit": unit,
                "fence": fence,
                "worker": worker.name,
            },
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
    if lease.fence != fence:
        raise StaleLease(
            f"fence {fence} does not match lease {lease.id} (fence {lease.fence})",
            field="fence",
        )
    if lease.status != LeaseStatus.ACTIVE:
        raise StaleLease(f"lease {lease.id} is {lease.status}; a newer holder may own this work")
    if lease.expires_at <= timezone.now():
        raise StaleLease(f"lease {lease.id} expired at {lease.expires_at.isoformat()}")
    return run, lease


@dataclass(frozen=True)
class HeartbeatResult:
    expires_at: Any
    cancel_requested: bool


def lease_heartbeat(*, worker: WorkerIdentity, lease_id: str, fence: int) -> HeartbeatResult:
    with transaction.atomic():
        run, lease = _locked_active_lease(lease_id=lease_id, fence=fence, worker=worker)
        now = timezone.now()
        lease.heartbeat_at = now
        lease.expires_at = now + _lease_ttl()
        lease.save(update_fields=["heartbeat_at", "expires_at"])
    return HeartbeatResult(
        expires_at=lease.expires_at,
        cancel_requested=run.cancel_requested_at is not None,
    )


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
        now = timezone.now()
        lease.status = LeaseStatus.COMPLETED
        lease.ended_at = now
        lease.save(update_fields=["status", "ended_at"])
        run.status = outcome
        run.finished_at = now
        run.summary = summary or {}
        run.error = error
        run.save(update_fields=["status", "finished_at", "summary", "error", "updated_at"])
        event_append(
            run_id=run.id,
            type=f"run.{outcome}",
            data={"summary": run.summary, "error": error or None},
        )
    return run


def lease_release(*, worker: WorkerIdentity, lease_id: str, fence: int, reason: str = "") -> Run:
    """Give the work back (e.g. a worker shutting down): the run is queued again."""
    with transaction.atomic():
        run, lease = _locked_active_lease(lease_id=lease_id, fence=fence, worker=worker)
        lease.status = LeaseStatus.RELEASED
        lease.ended_at = timezone.now()
        lease.save(update_fields=["status", "ended_at"])
        _return_to_queue(run=run, lease=lease, event_type="lease.released", reason=reason)
    _notify_requeued(run_id=run.id)
    return run


def _return_to_queue(*, run: Run, lease: Lease, event_type: str, reason: str) -> None:
    event_append(
        run_id=run.id,
        type=event_type,
        data={"lease": lease.id, "fence": lease.fence, "reason": reason},
    )
    if run.cancel_requested_at is not None:
        run.status = RunStatus.CANCELLED
        run.finished_at = timezone.now()
        run.save(update_fields=["status", "finished_at", "updated_at"])
        event_append(
            run_id=run.id,
            type="run.cancelled",
            data={"reason": "cancelled while its holder was gone"},
        )
    else:
        run.status = RunStatus.QUEUED
        run.save(update_fields=["status", "updated_at"])
        event_append(run_id=run.id, type="run.requeued", data={})


def _notify_requeued(*, run_id: str) -> None:
    # Hook for dispatchers (the execution core) to pick requeued work up promptly.
    pass


def lease_reap(*, now: Any = None) -> int:
    """Expire lapsed leases and return their work to the queue. Safe to run concurrently."""
    now = now or timezone.now()
    reaped = 0
    lapsed = list(
        Lease.objects.filter(status=LeaseStatus.ACTIVE, expires_at__lte=now).values_list("id", "run_id")[:500]
    )
    for lease_id, run_id in lapsed:
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=run_id)
            lease = Lease.objects.select_for_update().get(pk=lease_id)
            # Re-check under the locks: the holder may have heartbeated or completed meanwhile.
            if lease.status != LeaseStatus.ACTIVE or lease.expires_at > now:
                continue
            lease.status = LeaseStatus.EXPIRED
            lease.ended_at = now
            lease.save(update_fields=["status", "ended_at"])
            reaped += 1
            if lease.unit.startswith("trial:"):
                # A trial's worker vanished: retry or lose the trial, per the plan.
                from apps.runs.execution import trial_lease_lapsed

                event_append(run_id=run.id, type="lease.expired", data={"lease": lease.id, "unit": lease.unit})
                trial_lease_lapsed(run=run, lease=lease)
                continue
            _return_to_queue(run=run, lease=lease, event_type="lease.expired", reason="no heartbeat")
        _notify_requeued(run_id=run_id)
    if reaped:
        logger.info("reaped %d lapsed leases", reaped)
    return reaped
