from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from apps.accounts.models import Organization, WorkerIdentity
from apps.core.ids import PrefixedIdField


class RunKind(models.TextChoices):
    EXECUTE = "execute"
    EVALUATE = "evaluate"
    TRAIN = "train"


class RunStatus(models.TextChoices):
    ACCEPTED = "accepted"  # admitted; prerequisites not yet checked
    QUEUED = "queued"  # prerequisites durably ready; claimable
    RUNNING = "running"  # a worker holds the lease
    CANCELLING = "cancelling"  # cancel requested; the holder learns it at its next heartbeat
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})


class Run(models.Model):
    id = PrefixedIdField(prefix="run")
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="runs")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    kind = models.CharField(max_length=16, choices=RunKind.choices)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.ACCEPTED)
    idempotency_key = models.CharField(max_length=200)
    request_digest = models.CharField(max_length=64, help_text="sha256 of the canonical request body")
    last_event_seq = models.PositiveIntegerField(default=0)
    summary = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org", "idempotency_key"], name="run_unique_idempotency_key"),
        ]
        indexes = [models.Index(fields=["org", "status"]), models.Index(fields=["status", "id"])]

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def __str__(self) -> str:
        return self.id


class RunSpec(models.Model):
    """What was accepted, pinned: exact versions and digests and the plan. Never changes.

    UPDATE and DELETE are refused by a database trigger (see the migration).
    """

    run = models.OneToOneField(Run, primary_key=True, on_delete=models.CASCADE, related_name="spec")
    dataset_version = models.ForeignKey("datasets.DatasetVersion", on_delete=models.PROTECT, related_name="+")
    dataset_ref = models.CharField(max_length=300)
    dataset_digest = models.CharField(max_length=64)
    actor_version = models.ForeignKey("profiles.ProfileVersion", on_delete=models.PROTECT, related_name="+")
    actor_digest = models.CharField(max_length=64)
    judge_version = models.ForeignKey(
        "profiles.ProfileVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    judge_digest = models.CharField(max_length=64, blank=True)
    model_binding = models.JSONField(help_text="the actor's model binding (route or checkpoint)")
    plan = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"spec of {self.run_id}"


class RunEvent(models.Model):
    """One lifecycle fact; `seq` orders a run's events from 1 without gaps."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=64)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="runevent_unique_seq")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"


class LeaseStatus(models.TextChoices):
    ACTIVE = "active"
    COMPLETED = "completed"
    RELEASED = "released"
    EXPIRED = "expired"


class Lease(models.Model):
    """A worker's exclusive, expiring hold on a unit of work (the run, or later a group).

    `fence` grows by one for each lease ever granted on the same (run, unit): a write
    that carries an older fence than the active lease's is a stale worker's and is
    rejected inside the writing transaction.
    """

    id = PrefixedIdField(prefix="lse")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="leases")
    unit = models.CharField(max_length=100, default="run")
    worker = models.ForeignKey(WorkerIdentity, on_delete=models.PROTECT, related_name="leases")
    fence = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=LeaseStatus.choices, default=LeaseStatus.ACTIVE)
    acquired_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "unit", "fence"], name="lease_unique_fence"),
            # At most one active lease per unit, enforced by the database, not by care.
            models.UniqueConstraint(
                fields=["run", "unit"], condition=Q(status="active"), name="lease_one_active_per_unit"
            ),
        ]
        indexes = [models.Index(fields=["status", "expires_at"])]

    def __str__(self) -> str:
        return f"{self.id} on {self.run_id}/{self.unit} (fence {self.fence}, {self.status})"


class LeaseWrite(models.Model):
    """Dedupe record of a progress write: a retried (lease, local_seq) is applied once."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="writes")
    local_seq = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["lease", "local_seq"], name="leasewrite_unique_seq")]
