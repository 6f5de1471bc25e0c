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
    REGRADE = "regrade"  # re-assess another run's retained outputs with a judge


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
        indexes = [
            models.Index(fields=["org", "status"]),
            models.Index(fields=["status", "id"]),
        ]

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
        "profiles.ProfileVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    judge_digest = models.CharField(max_length=64, blank=True)
    model_binding = models.JSONField(help_text="the actor's model binding (route or checkpoint)")
    # A run with several actors (`actors` at submission) lists them here, in the order given:
    # [{"id", "profile", "version", "digest", "engine"}]; actor_version is the first. Every
    # actor binds model_binding. Empty for a run of one actor.
    actors = models.JSONField(default=list, blank=True, help_text="the actors of a mixed run, in order")
    judge_binding = models.JSONField(null=True, blank=True, help_text="the judge's model binding, if it has one")
    plan = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"spec of {self.run_id}"


class RunEvent(models.Model):
    """One lifecycle fact; `seq` orders a run's events from 1 without gaps."""

    # No index of its own: the (run, seq) unique constraint's index serves every lookup by
    # run, and the largest table of the platform kept two more (run_id and its LIKE twin)
    # on every append.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
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
    # No index of its own: the (run, unit, fence) constraint leads with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="leases", db_index=False)
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
                fields=["run", "unit"],
                condition=Q(status="active"),
                name="lease_one_active_per_unit",
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


# --------------------------------------------------------------------------- execution


class GroupStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"  # a worker claimed one of its trials
    SETTLED = "settled"  # every trial ended (assessed, failed, lost or cancelled)


class SamplingGroup(models.Model):
    """One task version x the run's pinned recipe x N attempts x one sampler snapshot.

    Evaluation, training and unscored execution all run groups; they differ only in what
    happens after assessment. `sampler` is the model binding the group's attempts use
    (a route, or a checkpoint for training runs), fixed when the group is made.
    """

    id = PrefixedIdField(prefix="grp")
    # No index of its own: the (run, step, position) constraint leads with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="groups", db_index=False)
    step = models.PositiveIntegerField(default=0, help_text="training step (batch) the group belongs to")
    position = models.PositiveIntegerField(help_text="the task's position in the dataset version")
    task_version = models.ForeignKey("datasets.TaskVersion", on_delete=models.PROTECT, related_name="+")
    attempts = models.PositiveIntegerField()
    sampler = models.JSONField(default=dict, blank=True)
    # The actor whose recipe every attempt of the group runs (a mixed run's groups differ;
    # null: the run's one actor). One actor per group keeps group-relative advantages
    # comparing attempts of the same harness.
    actor = models.ForeignKey(
        "profiles.ProfileVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    sampler_step = models.PositiveIntegerField(default=0, help_text="training: the step whose weights it samples")
    status = models.CharField(max_length=16, choices=GroupStatus.choices, default=GroupStatus.PENDING)
    summary = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step", "position"], name="group_unique_position")]

    def __str__(self) -> str:
        return self.id


class TrialStatus(models.TextChoices):
    PENDING = "pending"  # enqueued
    WAITING = "waiting"  # holds a lease, waiting for resources on its worker
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # ran to the end; rewards recorded (or none for execute runs)
    FAILED = "failed"  # ended in an error (exception type and message recorded)
    CANCELLED = "cancelled"
    LOST = "lost"  # its worker vanished and the plan said not to retry


TRIAL_TERMINAL = frozenset({TrialStatus.SUCCEEDED, TrialStatus.FAILED, TrialStatus.CANCELLED, TrialStatus.LOST})


class Trial(models.Model):
    """One sandboxed attempt. Its id is the correlation id carried into its bindings,
    events and model calls."""

    id = PrefixedIdField(prefix="trl")
    # No index of their own: (run, status) and the (group, attempt) unique constraint lead
    # with them, and a trial's status changes (not HOT: status is indexed) write every index.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="trials", db_index=False)
    group = models.ForeignKey(SamplingGroup, on_delete=models.CASCADE, related_name="trials", db_index=False)
    attempt = models.PositiveIntegerField()
    task_version = models.ForeignKey("datasets.TaskVersion", on_delete=models.PROTECT, related_name="+")
    source = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="regrades",
        help_text="for a regrade: the attempt whose retained workdir is re-assessed",
    )
    status = models.CharField(max_length=16, choices=TrialStatus.choices, default=TrialStatus.PENDING)
    tries = models.PositiveIntegerField(default=0, help_text="how many times a worker started it")
    rewards = models.JSONField(null=True, blank=True)
    reward = models.FloatField(null=True, blank=True, help_text='rewards["reward"], or the mean of the rewards')
    error_type = models.CharField(max_length=200, blank=True)
    error_message = models.TextField(blank=True)
    timings = models.JSONField(default=dict, blank=True)
    need = models.JSONField(default=dict, blank=True, help_text="cpus, memory_mb, storage_mb reserved")
    worker_node = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    queued_at = models.DateTimeField(null=True, blank=True, help_text="handed to the trials queue")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["group", "attempt"], name="trial_unique_attempt")]
        # (status, queued_at): the sweeper's look for pending trials whose message was lost.
        indexes = [models.Index(fields=["run", "status"]), models.Index(fields=["status", "queued_at"])]

    @property
    def is_terminal(self) -> bool:
        return self.status in TRIAL_TERMINAL

    def __str__(self) -> str:
        return self.id


class Artifact(models.Model):
    """A file a trial produced (logs, transcript, verifier output, required outputs),
    stored content-addressed in the object store."""

    id = PrefixedIdField(prefix="art")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts")
    # No index of its own: the (trial, name) constraint leads with it.
    trial = models.ForeignKey(
        Trial, null=True, blank=True, on_delete=models.CASCADE, related_name="artifacts", db_index=False
    )
    name = models.CharField(max_length=500, help_text="path relative to the trial, e.g. agent/claude-code.jsonl")
    kind = models.CharField(max_length=32, default="log")
    object = models.ForeignKey("objects.StoredObject", on_delete=models.PROTECT, related_name="+")
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["trial", "name"], name="artifact_unique_name")]

    def __str__(self) -> str:
        return f"{self.trial_id}:{self.name}"


class WorkerNode(models.Model):
    """A trials worker host and its resource budget; admission reserves against it."""

    name = models.CharField(max_length=100, primary_key=True)
    slots = models.PositiveIntegerField()
    cpus = models.FloatField()
    memory_mb = models.PositiveIntegerField()
    storage_mb = models.PositiveIntegerField()
    seen_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.name


class ReservationStatus(models.TextChoices):
    WAITING = "waiting"
    HELD = "held"
    RELEASED = "released"


class Reservation(models.Model):
    """A trial's claim on a worker's budget. Waiting reservations are granted in arrival
    order (the id) among those that fit; see `admission_try`.

    A reservation belongs to the trial's lease and to the worker process that asked for it
    (`holder`, see apps.core.process): when either is gone the reservation is released (by
    the reaper with the lease, by a trials worker starting on the host, by admission itself).
    """

    # No index of its own: the (node, status) index leads with it.
    node = models.ForeignKey(WorkerNode, on_delete=models.CASCADE, related_name="reservations", db_index=False)
    trial = models.ForeignKey(Trial, on_delete=models.CASCADE, related_name="reservations")
    lease = models.ForeignKey(Lease, null=True, blank=True, on_delete=models.SET_NULL, related_name="reservations")
    holder = models.CharField(max_length=200, blank=True, help_text="host/boot/pid/start of the worker process")
    cpus = models.FloatField()
    memory_mb = models.PositiveIntegerField()
    storage_mb = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=ReservationStatus.choices, default=ReservationStatus.WAITING)
    created_at = models.DateTimeField(auto_now_add=True)
    granted_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["node", "status"])]
