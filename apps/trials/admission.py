"""Resource-aware admission of trials on a trials worker.

Each worker node has a budget (trial slots, CPUs, memory MB, storage MB). A trial's need
comes from its task.toml with the plan's overrides. A trial that does not fit waits (it
neither fails nor spins a slot); waiting reservations are granted in arrival order among
those that fit, so small trials may pass a big one only until the big one has waited
`AGING_SECONDS`, after which nothing passes it (no starvation). A need larger than the
whole budget can never be met and is refused at once.

Reservations belong to the trial's lease and to the worker process that asked (its
holder): the reservation ends with its trial (in `trial_complete`), with its lease (the
reaper), or with its process (a worker starting on the host releases what no live process
holds). Admission itself never counts a reservation whose lease is dead.

A waiting trial is woken by a freed reservation: every release sends a PostgreSQL NOTIFY
naming the node (delivered when the release commits, never on a rollback), which the
waiters LISTEN for on a connection of their own. The wait still ends after a short
timeout, so that a lapsed lease or a cancel is noticed without a notification; on SQLite
(the embedded default) that timeout is the whole mechanism: a poll.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, Q, Sum
from django.utils import timezone

from apps.accounts.models import WorkerIdentity
from apps.accounts.services import worker_get_or_create
from apps.core.errors import ServiceError
from apps.core.process import process_alive, process_identity
from apps.runs.events import run_locked
from apps.runs.models import Lease, LeaseStatus, Reservation, ReservationStatus, Trial, WorkerNode
from apps.runs.transitions import reservation_transition
from synth_common.fresh_cache import FreshCache

logger = logging.getLogger(__name__)

AGING_SECONDS = 60.0
# The channel every release notifies; the payload is the node's name.
FREED_CHANNEL = "synth_admission_freed"


class NeverFits(ServiceError):
    error_type = "resources_exceed_budget"


@dataclass(frozen=True)
class Need:
    cpus: float
    memory_mb: int
    storage_mb: int

    def as_dict(self) -> dict[str, float | int]:
        return {"cpus": self.cpus, "memory_mb": self.memory_mb, "storage_mb": self.storage_mb}


@dataclass(frozen=True)
class Budget:
    slots: int
    cpus: float
    memory_mb: int
    storage_mb: int


def node_register(*, name: str, budget: Budget) -> WorkerNode:
    node, _ = WorkerNode.objects.update_or_create(
        name=name,
        defaults={
            "slots": budget.slots,
            "cpus": budget.cpus,
            "memory_mb": budget.memory_mb,
            "storage_mb": budget.storage_mb,
        },
    )
    return node


# This process' node and worker identity, read (and the node registered) again once older
# than SYNTH_WORKER_LOOKUP_CHECK_SECONDS: the budget is the process' own settings (another
# budget is another key, registered at once) and seen_at is for the admin's eyes.
_nodes: FreshCache[tuple[str, Budget], WorkerNode] = FreshCache(
    maxsize=4, check_seconds=lambda: settings.SYNTH_WORKER_LOOKUP_CHECK_SECONDS
)
_workers: FreshCache[str, WorkerIdentity] = FreshCache(
    maxsize=4, check_seconds=lambda: settings.SYNTH_WORKER_LOOKUP_CHECK_SECONDS
)


def node_current() -> WorkerNode:
    """This worker's node, registered with the budget its settings give it. Read-only: the
    row is shared by the process' trials while it is fresh."""
    name = settings.SYNTH_WORKER_NAME
    budget = Budget(
        slots=settings.SYNTH_WORKER_SLOTS,
        cpus=settings.SYNTH_WORKER_CPUS,
        memory_mb=settings.SYNTH_WORKER_MEMORY_MB,
        storage_mb=settings.SYNTH_WORKER_STORAGE_MB,
    )
    node = _nodes.read_through((name, budget), read=lambda: node_register(name=name, budget=budget))
    assert node is not None  # node_register always returns one
    return node


def node_worker(*, node: WorkerNode) -> WorkerIdentity:
    """The worker identity the node's trials claim their leases as (shared, read-only)."""
    name = f"trials@{node.name}"
    worker = _workers.read_through(name, read=lambda: worker_get_or_create(name=name))
    assert worker is not None  # worker_get_or_create always returns one
    return worker


def trial_need(*, trial: Trial, plan: dict[str, Any]) -> Need:
    """What the trial's task asks for (its task.toml), with the plan's overrides."""
    overrides = plan.get("resources") or {}
    tv = trial.task_version
    return Need(
        cpus=float(overrides.get("cpus", tv.cpus)),
        memory_mb=int(overrides.get("memory_mb", tv.memory_mb)),
        storage_mb=int(overrides.get("storage_mb", tv.storage_mb)),
    )


OPEN = (ReservationStatus.WAITING, ReservationStatus.HELD)


def node_usage(*, node: WorkerNode) -> dict[str, float | int]:
    # One statement: every admission try and every grant reads it.
    held = Q(status=ReservationStatus.HELD)
    sums = Reservation.objects.filter(node=node, status__in=OPEN).aggregate(
        slots=Count("pk", filter=held),
        cpus=Sum("cpus", filter=held),
        memory_mb=Sum("memory_mb", filter=held),
        storage_mb=Sum("storage_mb", filter=held),
        waiting=Count("pk", filter=Q(status=ReservationStatus.WAITING)),
    )
    return {
        "slots": sums["slots"],
        "cpus": sums["cpus"] or 0,
        "memory_mb": sums["memory_mb"] or 0,
        "storage_mb": sums["storage_mb"] or 0,
        "waiting": sums["waiting"],
    }


def admission_request(
    *, node: WorkerNode, trial: Trial, need: Need, lease: Lease | None = None, holder: str | None = None
) -> Reservation:
    """Join the node's queue (idempotent per trial and lease: a retried task keeps its
    place). The reservation belongs to ``lease`` (default: the trial's active lease) and
    to ``holder`` (default: this process)."""
    if need.cpus > node.cpus or need.memory_mb > node.memory_mb or need.storage_mb > node.storage_mb:
        raise NeverFits(
            f"the task needs {need.cpus:g} CPUs, {need.memory_mb} MB memory and {need.storage_mb} MB storage; "
            f"worker {node.name} has {node.cpus:g} CPUs, {node.memory_mb} MB and {node.storage_mb} MB in all"
        )
    if lease is None:
        lease = Lease.objects.filter(run_id=trial.run_id, unit=f"trial:{trial.id}", status=LeaseStatus.ACTIVE).first()
    for existing in Reservation.objects.filter(node=node, trial=trial, status__in=OPEN):
        if existing.lease_id == (lease.id if lease else None):
            return existing
        reservation_transition(reservation=existing, to=ReservationStatus.RELEASED, why="its trial took a new lease")
    return Reservation.objects.create(
        node=node,
        trial=trial,
        lease=lease,
        holder=holder or process_identity(),
        cpus=need.cpus,
        memory_mb=need.memory_mb,
        storage_mb=need.storage_mb,
    )


def _fits(free: dict[str, float], r: Reservation) -> bool:
    return (
        free["slots"] >= 1
        and r.cpus <= free["cpus"] + 1e-9
        and r.memory_mb <= free["memory_mb"]
        and (r.storage_mb <= free["storage_mb"])
    )


def admission_try(
    *, reservation: Reservation, on_grant: Callable[[dict[str, float | int]], None] | None = None
) -> bool:
    """Grant the reservation if the FIFO-within-what-fits order admits it now. ``on_grant``
    runs in the grant's transaction with the node's use the grant leaves (a trials worker
    starts its trial there); if it raises, the grant is rolled back with it and the error
    goes to the caller. A reservation granted already (a repeat after a lost
    acknowledgement) is True without it."""
    with transaction.atomic():
        # The node row lock serializes admission decisions on one node.
        node = WorkerNode.objects.select_for_update(no_key=True).get(pk=reservation.node_id)
        decision = _admitted(node=node, reservation_id=reservation.pk)
        # Only a refusal looks for reservations whose lease is dead: what they hold could be
        # what stands in the way (an admission that fits anyway has no need of it).
        if decision is None and _dead_leases_release(node=node):
            decision = _admitted(node=node, reservation_id=reservation.pk)
        if decision is None:
            return False
        current, run_id, usage = decision
        if current.status != ReservationStatus.WAITING:
            return current.status == ReservationStatus.HELD
        # The grant and the start made in on_grant lock the run's row once and append their
        # events in one statement: every round trip here is a freed slot still idle.
        with run_locked(run_id=run_id, lock=True):
            granted = reservation_transition(reservation=current, to=ReservationStatus.HELD, run_id=run_id)
            if granted and on_grant is not None:
                on_grant(usage)
        return granted


def _admitted(*, node: WorkerNode, reservation_id: int) -> tuple[Reservation, str, dict[str, float | int]] | None:
    """The reservation, its trial's run and the node's use with it granted, if it is granted
    already or the FIFO-within-what-fits order admits it now; else None. One read of the node's open
    reservations (a node has a handful) serves the use, the queue and the reservation
    itself. Caller holds the node's lock."""
    open_ = list(
        Reservation.objects.filter(node=node, status__in=OPEN).annotate(trial_run_id=F("trial__run_id")).order_by("id")
    )
    current = next((r for r in open_ if r.pk == reservation_id), None)
    if current is None:  # released: nothing to grant
        return None
    run_id: str = current.trial_run_id  # annotated by the query
    held = [r for r in open_ if r.status == ReservationStatus.HELD]
    usage: dict[str, float | int] = {
        "slots": len(held),
        "cpus": sum(r.cpus for r in held),
        "memory_mb": sum(r.memory_mb for r in held),
        "storage_mb": sum(r.storage_mb for r in held),
        "waiting": len(open_) - len(held),
    }
    if current.status == ReservationStatus.HELD:
        return current, run_id, usage
    free = {
        "slots": node.slots - usage["slots"],
        "cpus": node.cpus - usage["cpus"],
        "memory_mb": node.memory_mb - usage["memory_mb"],
        "storage_mb": node.storage_mb - usage["storage_mb"],
    }
    aged = timezone.now() - timedelta(seconds=AGING_SECONDS)
    for waiting in (r for r in open_ if r.status == ReservationStatus.WAITING):
        if _fits(free, waiting):
            if waiting.pk == current.pk:
                return (
                    current,
                    run_id,
                    {
                        "slots": usage["slots"] + 1,
                        "cpus": usage["cpus"] + current.cpus,
                        "memory_mb": usage["memory_mb"] + current.memory_mb,
                        "storage_mb": usage["storage_mb"] + current.storage_mb,
                        "waiting": usage["waiting"] - 1,
                    },
                )
            # An earlier reservation fits: it will take these resources when it polls.
            free["slots"] -= 1
            free["cpus"] -= waiting.cpus
            free["memory_mb"] -= waiting.memory_mb
            free["storage_mb"] -= waiting.storage_mb
        elif waiting.created_at <= aged:
            return None  # it has waited long enough: nothing behind it may pass
        if waiting.pk == current.pk:
            return None
    return None


def _freed_notify(*, node_id: str) -> None:
    """Wake the node's waiting trials once the caller's release commits."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [FREED_CHANNEL, node_id])


class _KeptListener:
    """The LISTEN connection a process keeps between its waits, as long as
    SYNTH_DB_CONN_MAX_AGE keeps its other connections (none when that is 0): a wait
    started on a new connection cost a PostgreSQL backend's start for each waiting trial."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.conn: Any = None
        self.opened = 0.0
        self.pid = os.getpid()
        # Connections a forked child inherited: never used, never closed (closing would end
        # the parent's session on the socket they share), only kept from being collected.
        self.inherited: list[Any] = []

    @staticmethod
    def _max_age() -> float | None:
        """Django's CONN_MAX_AGE: seconds, 0 (close after use) or None (no limit)."""
        return connection.settings_dict.get("CONN_MAX_AGE", 0)

    def take(self) -> tuple[Any, float]:
        """The kept connection (None if there is none live and young enough) and when it was
        opened; the caller owns it until it gives it back."""
        with self.lock:
            if self.pid != os.getpid():
                if self.conn is not None:
                    self.inherited.append(self.conn)
                self.conn, self.pid = None, os.getpid()
            conn, opened, self.conn = self.conn, self.opened, None
        max_age = self._max_age()
        if conn is not None and (conn.closed or (max_age is not None and time.monotonic() - opened > max_age)):
            conn.close()
            conn = None
        return conn, opened

    def give_back(self, conn: Any, *, opened: float) -> bool:
        """Keep ``conn`` for the next wait (True), or leave it to the caller to close."""
        if self._max_age() == 0 or conn.closed or self.pid != os.getpid():
            return False
        with self.lock:
            if self.conn is not None:
                return False
            self.conn, self.opened = conn, opened
        return True


_kept = _KeptListener()


def kept_listener_close() -> None:
    """Close the process' kept LISTEN connection, if any (a process that ends; tests)."""
    conn, _ = _kept.take()
    if conn is not None:
        conn.close()


class FreedWake:
    """A waiting trial's ear for freed reservations on its node: a LISTEN on a dedicated
    connection (PostgreSQL), or nothing but the timeout (SQLite, or when the connection
    cannot be opened: the wait degrades to the poll it replaces). Open it before the try
    whose failure leads to a wait, so that a release committed in between is not missed.

    The connection is the process' kept one when it has one (_KeptListener): what it heard
    before this wait began is dropped first, so only releases from here on wake it."""

    def __init__(self, *, node_name: str) -> None:
        self.node_name = node_name
        self._conn: Any = None
        self._opened = 0.0
        if connection.vendor != "postgresql":
            return
        import psycopg

        self._conn, self._opened = _kept.take()
        if self._conn is not None:
            try:
                # A round trip first: it proves the kept connection alive, and every notice
                # of a release committed before it arrives ahead of its answer. Those
                # releases the next try sees; only later ones may wake this wait.
                self._conn.execute("SELECT 1")
                while any(True for _ in self._conn.notifies(timeout=0)):
                    pass
                return
            except psycopg.Error:
                self._discard()  # it died (a database restart): listen on a new one
        try:
            db = connection.settings_dict
            self._conn = psycopg.connect(
                dbname=db["NAME"],
                user=db["USER"] or None,
                password=db["PASSWORD"] or None,
                host=db["HOST"] or None,
                port=db["PORT"] or None,
                autocommit=True,
                connect_timeout=5,
            )
            self._opened = time.monotonic()
            self._conn.execute(f"LISTEN {FREED_CHANNEL}")
        except psycopg.Error:
            logger.warning("cannot LISTEN for freed reservations; polling instead", exc_info=True)
            self._discard()

    def wait(self, *, timeout: float) -> bool:
        """Block until a reservation of this node is freed (True) or ``timeout`` passes."""
        if self._conn is None:
            time.sleep(timeout)
            return False
        import psycopg

        deadline = time.monotonic() + timeout
        try:
            while (left := deadline - time.monotonic()) > 0:
                for note in self._conn.notifies(timeout=left, stop_after=1):
                    if note.payload == self.node_name:
                        return True
        except psycopg.Error:
            logger.warning("lost the LISTEN connection for freed reservations; polling instead", exc_info=True)
            self._discard()
        return False

    def _discard(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def close(self) -> None:
        if self._conn is not None and not _kept.give_back(self._conn, opened=self._opened):
            self._discard()
        self._conn = None

    def __enter__(self) -> FreedWake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def admission_release(*, reservation: Reservation, why: str = "its trial ended") -> bool:
    """Give the reservation's resources back (a no-op once released)."""
    with transaction.atomic():
        released = reservation_transition(reservation=reservation, to=ReservationStatus.RELEASED, why=why)
        if released:
            _freed_notify(node_id=reservation.node_id)
    return released


def reservations_release(*, lease: Lease, why: str) -> int:
    """Release what a lease held, in the caller's transaction (the lease just ended)."""
    released: list[str] = [
        r.node_id
        for r in Reservation.objects.filter(lease=lease, status__in=OPEN)
        if reservation_transition(reservation=r, to=ReservationStatus.RELEASED, why=why, run_id=lease.run_id)
    ]
    for node_id in sorted(set(released)):
        _freed_notify(node_id=node_id)
    return len(released)


def _dead_leases_release(*, node: WorkerNode) -> int:
    """Release the node's reservations whose lease ended or lapsed: admission never waits
    on resources that nobody can be using under a live lease."""
    dead = Reservation.objects.filter(node=node, status__in=OPEN).filter(
        Q(lease__status__in=[LeaseStatus.COMPLETED, LeaseStatus.RELEASED, LeaseStatus.EXPIRED])
        | Q(lease__status=LeaseStatus.ACTIVE, lease__expires_at__lte=timezone.now())
    )
    released = sum(
        reservation_transition(reservation=r, to=ReservationStatus.RELEASED, why="its lease is no longer live")
        for r in dead
    )
    if released:
        _freed_notify(node_id=node.pk)
    return released


def node_orphans_release(*, node_name: str) -> int:
    """Release the node's reservations that no live process holds (their worker was killed:
    SIGKILL, OOM, a reboot). Called when a worker starts on this host; holders on another
    host (or of unknown liveness) are left to their leases."""
    released = 0
    for reservation in Reservation.objects.filter(node_id=node_name, status__in=OPEN).exclude(holder=""):
        if process_alive(identity=reservation.holder) is False:
            released += reservation_transition(
                reservation=reservation,
                to=ReservationStatus.RELEASED,
                why=f"its worker process {reservation.holder} is gone",
            )
    if released:
        _freed_notify(node_id=node_name)
        logger.warning("released %d reservations of %s held by processes that are gone", released, node_name)
    return released
