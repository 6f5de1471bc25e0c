"""Resource-aware admission of trials on a trials worker.

Each worker node has a budget (trial slots, CPUs, memory MB, storage MB). A trial's need
comes from its task.toml with the plan's overrides. A trial that does not fit waits (it
neither fails nor spins a slot); waiting reservations are granted in arrival order among
those that fit, so small trials may pass a big one only until the big one has waited
`AGING_SECONDS`, after which nothing passes it (no starvation). A need larger than the
whole budget can never be met and is refused at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from apps.core.errors import ServiceError
from apps.runs.models import Reservation, ReservationStatus, Trial, WorkerNode

AGING_SECONDS = 60.0


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


def node_usage(*, node: WorkerNode) -> dict[str, float | int]:
    held = Reservation.objects.filter(node=node, status=ReservationStatus.HELD)
    sums = held.aggregate(cpus=Sum("cpus"), memory_mb=Sum("memory_mb"), storage_mb=Sum("storage_mb"))
    return {
        "slots": held.count(),
        "cpus": sums["cpus"] or 0,
        "memory_mb": sums["memory_mb"] or 0,
        "storage_mb": sums["storage_mb"] or 0,
        "waiting": Reservation.objects.filter(node=node, status=ReservationStatus.WAITING).count(),
    }


def admission_request(*, node: WorkerNode, trial: Trial, need: Need) -> Reservation:
    """Join the node's queue (idempotent per trial: a retried task keeps its place)."""
    if need.cpus > node.cpus or need.memory_mb > node.memory_mb or need.storage_mb > node.storage_mb:
        raise NeverFits(
            f"the task needs {need.cpus:g} CPUs, {need.memory_mb} MB memory and {need.storage_mb} MB storage; "
            f"worker {node.name} has {node.cpus:g} CPUs, {node.memory_mb} MB and {node.storage_mb} MB in all"
        )
    existing = Reservation.objects.filter(
        node=node, trial=trial, status__in=[ReservationStatus.WAITING, ReservationStatus.HELD]
    ).first()
    if existing is not None:
        return existing
    return Reservation.objects.create(
        node=node, trial=trial, cpus=need.cpus, memory_mb=need.memory_mb, storage_mb=need.storage_mb
    )


def _fits(free: dict[str, float], r: Reservation) -> bool:
    return (
        free["slots"] >= 1
        and r.cpus <= free["cpus"] + 1e-9
        and r.memory_mb <= free["memory_mb"]
        and (r.storage_mb <= free["storage_mb"])
    )


def admission_try(*, reservation: Reservation) -> bool:
    """Grant the reservation if the FIFO-within-what-fits order admits it now."""
    with transaction.atomic():
        # The node row lock serializes admission decisions on one node.
        node = WorkerNode.objects.select_for_update().get(pk=reservation.node_id)
        current = Reservation.objects.get(pk=reservation.pk)
        if current.status != ReservationStatus.WAITING:
            return current.status == ReservationStatus.HELD
        usage = node_usage(node=node)
        free = {
            "slots": node.slots - usage["slots"],
            "cpus": node.cpus - usage["cpus"],
            "memory_mb": node.memory_mb - usage["memory_mb"],
            "storage_mb": node.storage_mb - usage["storage_mb"],
        }
        aged = timezone.now() - timedelta(seconds=AGING_SECONDS)
        for waiting in Reservation.objects.filter(node=node, status=ReservationStatus.WAITING).order_by("id"):
            if _fits(free, waiting):
                if waiting.pk == current.pk:
                    current.status = ReservationStatus.HELD
                    current.granted_at = timezone.now()
                    current.save(update_fields=["status", "granted_at"])
                    return True
                # An earlier reservation fits: it will take these resources when it polls.
                free["slots"] -= 1
                free["cpus"] -= waiting.cpus
                free["memory_mb"] -= waiting.memory_mb
                free["storage_mb"] -= waiting.storage_mb
            elif waiting.created_at <= aged:
                return False  # it has waited long enough: nothing behind it may pass
            if waiting.pk == current.pk:
                return False
        return False


def admission_release(*, reservation: Reservation) -> None:
    Reservation.objects.filter(pk=reservation.pk).exclude(status=ReservationStatus.RELEASED).update(
        status=ReservationStatus.RELEASED, released_at=timezone.now()
    )
