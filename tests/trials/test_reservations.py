"""Reservations belong to leases and to worker processes: the reaper releases a lapsed
lease's reservations with it, admission never waits on a reservation whose lease is dead,
and a worker starting on the host releases what no live process holds."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from apps.accounts.services import worker_get_or_create
from apps.core.process import process_alive, process_identity
from apps.runs import leases
from apps.runs.dispatch import run_dispatch
from apps.runs.leases import lease_reap, trial_claim
from apps.runs.models import Lease, Reservation, RunEvent, Trial
from apps.runs.services import run_schedule
from apps.trials.admission import (
    Budget,
    Need,
    admission_request,
    admission_try,
    node_orphans_release,
    node_register,
    node_usage,
)

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
NEED = Need(cpus=1, memory_mb=256, storage_mb=10)


@pytest.fixture
def trials(alice, inputs):
    body = dict(inputs["body"], plan={"attempts_per_task": 2, "max_retries": 1})
    run_id = alice.client.post("/api/runs", body, format="json").json()["id"]
    run_schedule(run_id=run_id)
    run_dispatch(run_id=run_id)
    return list(Trial.objects.filter(run_id=run_id).select_related("task_version").order_by("id"))


@pytest.fixture
def node():
    return node_register(name="n1", budget=Budget(slots=1, cpus=4, memory_mb=4096, storage_mb=1000))


def claimed(trial: Trial, node) -> tuple[Lease, Reservation]:
    lease = trial_claim(worker=worker_get_or_create(name="w"), trial_id=trial.id, node_name=node.name)
    return lease, admission_request(node=node, trial=trial, need=NEED)


def dead_identity() -> str:
    """The identity of a process that has exited."""
    out = subprocess.run(
        [sys.executable, "-c", "from apps.core.process import process_identity; print(process_identity())"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_a_reservation_records_its_lease_and_holding_process(trials, node):
    lease, reservation = claimed(trials[0], node)
    assert reservation.lease_id == lease.id
    assert reservation.holder == process_identity() and process_alive(identity=reservation.holder) is True
    assert admission_try(reservation=reservation) is True
    held = RunEvent.objects.get(run_id=trials[0].run_id, type="reservation.held")
    assert held.data == {"reservation": reservation.pk, "trial": trials[0].id, "node": "n1"}


def test_the_reaper_releases_a_lapsed_leases_reservations_with_it(trials, node):
    lease, reservation = claimed(trials[0], node)
    assert admission_try(reservation=reservation)
    Lease.objects.filter(pk=lease.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert lease_reap() == 1
    reservation.refresh_from_db()
    assert reservation.status == "released" and reservation.released_at is not None
    events = list(RunEvent.objects.filter(run_id=trials[0].run_id).order_by("-seq")[:3])
    assert [e.type for e in reversed(events)] == ["lease.expired", "reservation.released", "trial.requeued"]
    assert events[1].data["why"] == "its lease expired"
    assert node_usage(node=node)["slots"] == 0


def test_the_release_is_undone_with_the_lease_if_the_reap_fails(trials, node, monkeypatch):
    lease, reservation = claimed(trials[0], node)
    assert admission_try(reservation=reservation)
    Lease.objects.filter(pk=lease.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    def broken(**_):
        raise RuntimeError("the requeue failed")

    monkeypatch.setattr(leases, "trial_lease_lapsed", broken)
    with pytest.raises(RuntimeError):
        lease_reap()
    # One transaction: neither the lease nor its reservation moved.
    assert Lease.objects.get(pk=lease.pk).status == "active"
    assert Reservation.objects.get(pk=reservation.pk).status == "held"


def test_admission_never_waits_on_a_reservation_whose_lease_is_dead(trials, node):
    first_lease, first = claimed(trials[0], node)
    assert admission_try(reservation=first) is True
    _, second = claimed(trials[1], node)
    assert admission_try(reservation=second) is False  # the node's one slot is taken
    # The first trial's worker stopped heartbeating; the reaper has not come by yet.
    Lease.objects.filter(pk=first_lease.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert admission_try(reservation=second) is True
    first.refresh_from_db()
    assert first.status == "released"
    why = RunEvent.objects.get(type="reservation.released", data__reservation=first.pk).data["why"]
    assert why == "its lease is no longer live"


def test_a_retried_trial_under_a_new_lease_gets_a_new_reservation(trials, node):
    lease, reservation = claimed(trials[0], node)
    assert admission_request(node=node, trial=trials[0], need=NEED).pk == reservation.pk  # same lease: same place
    Lease.objects.filter(pk=lease.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    second_lease, second = claimed(trials[0], node)  # the claim expires the old lease itself
    assert second_lease.fence == 2 and second.pk != reservation.pk and second.lease_id == second_lease.id
    assert Reservation.objects.get(pk=reservation.pk).status == "released"


def test_a_worker_starting_releases_what_no_live_process_holds(trials, node):
    dead = dead_identity()
    assert process_alive(identity=dead) is False
    orphan = Reservation.objects.create(node=node, trial=trials[0], holder=dead, status="held", **NEED.as_dict())
    mine = Reservation.objects.create(
        node=node, trial=trials[1], holder=process_identity(), status="held", **NEED.as_dict()
    )
    elsewhere = Reservation.objects.create(
        node=node, trial=trials[1], holder="another-host/abcd/1/1", status="waiting", **NEED.as_dict()
    )
    assert node_orphans_release(node_name=node.name) == 1
    assert Reservation.objects.get(pk=orphan.pk).status == "released"
    assert Reservation.objects.get(pk=mine.pk).status == "held"  # its process is alive
    assert Reservation.objects.get(pk=elsewhere.pk).status == "waiting"  # another host's: its lease decides
    why = RunEvent.objects.get(type="reservation.released", data__reservation=orphan.pk).data["why"]
    assert why == f"its worker process {dead} is gone"
    assert node_orphans_release(node_name=node.name) == 0


def test_process_identities():
    me = process_identity()
    assert process_alive(identity=me) is True
    host, boot, pid, start = me.split("/")
    assert process_alive(identity=f"{host}/{boot}/{pid}/{int(start) + 1}") is False  # the pid, reused later
    assert process_alive(identity=f"{host}/other-boot/{pid}/{start}") is False  # before a reboot
    assert process_alive(identity=f"elsewhere/{boot}/{pid}/{start}") is None
    assert process_alive(identity="not an identity") is None


def test_a_zombie_holder_is_gone():
    # A killed worker's pool process whose parent died too can stay a zombie where the init
    # process reaps no orphans: it holds nothing, so its reservations must be released.
    child = subprocess.Popen(
        [sys.executable, "-c", "import os; print(open('/proc/self/stat').read())"], stdout=subprocess.PIPE
    )
    stat = child.stdout.read().decode()
    start = stat.rsplit(")", 1)[1].split()[19]
    host, boot, _, _ = process_identity().split("/")
    identity = f"{host}/{boot}/{child.pid}/{start}"
    # Not waited for yet: once it has exited, /proc shows it as a zombie with the same start time.
    while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        pass
    try:
        assert process_alive(identity=identity) is False
    finally:
        child.wait()
