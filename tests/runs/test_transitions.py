"""Every record's transition table: each allowed move succeeds and writes its event; each
move the table does not allow changes nothing and returns False; a status nothing moves to
raises; concurrent claims of one move on PostgreSQL have exactly one winner. And nothing
outside the transition functions writes a status."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone

from apps.accounts.services import worker_get_or_create
from apps.core.transitions import TransitionNotAllowed, TransitionTable
from apps.proxy.capture import DELIVERY_TRANSITIONS, INTEGRITY_TRANSITIONS, interaction_transition
from apps.proxy.models import Interaction
from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
from apps.runs.dispatch import run_dispatch
from apps.runs.models import Lease, Reservation, Run, RunEvent, RunStatus, SamplingGroup, Trial
from apps.runs.services import run_schedule, run_submit
from apps.runs.transitions import (
    GROUP_TRANSITIONS,
    LEASE_TRANSITIONS,
    RESERVATION_TRANSITIONS,
    RUN_TRANSITIONS,
    TRIAL_TRANSITIONS,
    group_transition,
    lease_transition,
    reservation_transition,
    run_transition,
    trial_transition,
)
from apps.training.models import LearningUpdate, Trainer
from apps.training.transitions import (
    TRAINER_TRANSITIONS,
    UPDATE_TRANSITIONS,
    trainer_transition,
    update_transition,
)
from apps.trials.admission import Budget, node_register

ROOT = Path(__file__).resolve().parents[2]


def _run(org, inputs, key: str = "k") -> Run:
    run, _ = run_submit(org=org, user=None, idempotency_key=key, body=inputs["body"])
    run_schedule(run_id=run.id)
    run_dispatch(run_id=run.id)
    return Run.objects.get(pk=run.pk)


@dataclass
class Record:
    """How to make a record of one kind in a given status, move it, and read it back."""

    table: TransitionTable
    make: Callable[[Any, Any, str], Any]  # (org, inputs, status) -> record
    move: Callable[[Any, str], bool]
    status: Callable[[Any], str]
    # How many events the record's run has (None: the record keeps its own timestamps).
    events: Callable[[Any], int] | None


def _events(run_id: str) -> int:
    return RunEvent.objects.filter(run_id=run_id).count()


def _make_run(org, inputs, status):
    run = _run(org, inputs)
    Run.objects.filter(pk=run.pk).update(status=status)
    return Run.objects.get(pk=run.pk)


def _make_trial(org, inputs, status):
    trial = _run(org, inputs).trials.select_related("task_version").first()
    Trial.objects.filter(pk=trial.pk).update(status=status)
    trial.refresh_from_db()
    return trial


def _make_group(org, inputs, status):
    group = _run(org, inputs).groups.first()
    SamplingGroup.objects.filter(pk=group.pk).update(status=status)
    group.refresh_from_db()
    return group


def _make_lease(org, inputs, status):
    run = _run(org, inputs)
    now = timezone.now()
    return Lease.objects.create(
        run=run,
        unit="test",
        worker=worker_get_or_create(name="w"),
        fence=1,
        status=status,
        heartbeat_at=now,
        expires_at=now + timedelta(minutes=1),
    )


def _make_reservation(org, inputs, status):
    trial = _run(org, inputs).trials.first()
    node = node_register(name="n", budget=Budget(slots=2, cpus=2, memory_mb=1024, storage_mb=1024))
    return Reservation.objects.create(node=node, trial=trial, cpus=1, memory_mb=1, storage_mb=1, status=status)


def _make_trainer(org, inputs, status):
    run = _run(org, inputs)
    return Trainer.objects.create(run=run, backend="local", route="r", base_model="", sampler={}, status=status)


def _make_update(org, inputs, status):
    return LearningUpdate.objects.create(run=_run(org, inputs), step=0, sampler={}, status=status)


def _make_interaction(field):
    def make(org, inputs, status):
        route, _ = route_upsert(**DEFAULT_ROUTE)
        return Interaction.objects.create(
            org=org, principal_kind="attempt", route=route, model_requested="m", **{field: status}
        )

    return make


RECORDS = {
    "run": Record(
        RUN_TRANSITIONS,
        _make_run,
        lambda r, to: run_transition(run=r, to=to, event=f"test.{to}"),
        lambda r: Run.objects.get(pk=r.pk).status,
        lambda r: _events(r.pk),
    ),
    "trial": Record(
        TRIAL_TRANSITIONS,
        _make_trial,
        lambda t, to: trial_transition(trial=t, to=to, event=f"test.{to}"),
        lambda t: Trial.objects.get(pk=t.pk).status,
        lambda t: _events(t.run_id),
    ),
    "group": Record(
        GROUP_TRANSITIONS,
        _make_group,
        lambda g, to: group_transition(group=g, to=to, event=f"test.{to}"),
        lambda g: SamplingGroup.objects.get(pk=g.pk).status,
        lambda g: _events(g.run_id),
    ),
    "lease": Record(
        LEASE_TRANSITIONS,
        _make_lease,
        lambda le, to: lease_transition(lease=le, to=to, event=f"test.{to}"),
        lambda le: Lease.objects.get(pk=le.pk).status,
        lambda le: _events(le.run_id),
    ),
    "reservation": Record(
        RESERVATION_TRANSITIONS,
        _make_reservation,
        lambda r, to: reservation_transition(reservation=r, to=to),
        lambda r: Reservation.objects.get(pk=r.pk).status,
        lambda r: _events(r.trial.run_id),
    ),
    "trainer": Record(
        TRAINER_TRANSITIONS,
        _make_trainer,
        lambda t, to: trainer_transition(trainer=t, to=to, event=f"test.{to}"),
        lambda t: Trainer.objects.get(pk=t.pk).status,
        lambda t: _events(t.run_id),
    ),
    "update": Record(
        UPDATE_TRANSITIONS,
        _make_update,
        lambda u, to: update_transition(update=u, to=to, event=f"test.{to}"),
        lambda u: LearningUpdate.objects.get(pk=u.pk).status,
        lambda u: _events(u.run_id),
    ),
    "interaction.delivery": Record(
        DELIVERY_TRANSITIONS,
        _make_interaction("delivery"),
        lambda i, to: interaction_transition(interaction_id=i.pk, field="delivery", to=to),
        lambda i: Interaction.objects.get(pk=i.pk).delivery,
        None,
    ),
    "interaction.integrity": Record(
        INTEGRITY_TRANSITIONS,
        _make_interaction("integrity"),
        lambda i, to: interaction_transition(interaction_id=i.pk, field="integrity", to=to),
        lambda i: Interaction.objects.get(pk=i.pk).integrity,
        None,
    ),
}


def _statuses(table: TransitionTable) -> list[str]:
    return [str(value) for value, _ in table.model._meta.get_field(table.field).choices]


def _moves(allowed: bool) -> list[tuple[str, str, str]]:
    out = []
    for kind, record in RECORDS.items():
        statuses = _statuses(record.table)
        for source in statuses:
            for to in statuses:
                reachable = bool(record.table._sources.get(to))
                if record.table.allows(source=source, to=to) == allowed and (allowed or reachable):
                    out.append((kind, source, to))
    return out


@pytest.mark.django_db
@pytest.mark.parametrize(("kind", "source", "to"), _moves(allowed=True))
def test_an_allowed_move_happens_once_with_its_event(alice, inputs, kind, source, to):
    record = RECORDS[kind]
    obj = record.make(alice.org, inputs, source)
    before = record.events(obj) if record.events else None
    assert record.move(obj, to) is True
    assert record.status(obj) == to
    if record.events:
        assert record.events(obj) == before + 1
        run_id = obj.trial.run_id if kind == "reservation" else getattr(obj, "run_id", obj.pk)
        last = RunEvent.objects.filter(run_id=run_id).order_by("-seq").first()
        assert last.type.endswith(to)
    # The same move again is not allowed from where the record now is (no self-moves).
    assert record.move(obj, to) is False
    if record.events:
        assert record.events(obj) == before + 1


@pytest.mark.django_db
@pytest.mark.parametrize(("kind", "source", "to"), _moves(allowed=False))
def test_a_move_the_table_does_not_allow_changes_nothing(alice, inputs, kind, source, to):
    record = RECORDS[kind]
    obj = record.make(alice.org, inputs, source)
    before = record.events(obj) if record.events else None
    assert record.move(obj, to) is False
    assert record.status(obj) == source
    if record.events:
        assert record.events(obj) == before


@pytest.mark.django_db
@pytest.mark.parametrize("kind", list(RECORDS))
def test_asking_for_a_move_no_row_allows_raises(alice, inputs, kind):
    record = RECORDS[kind]
    statuses = _statuses(record.table)
    initial = [s for s in statuses if not record.table._sources.get(s)]
    if initial:  # a status nothing moves to (where records are born)
        obj = record.make(alice.org, inputs, initial[0])
        with pytest.raises(TransitionNotAllowed):
            record.move(obj, initial[0])
    source, to = next((s, t) for s in statuses for t in statuses if s != t and not record.table.allows(source=s, to=t))
    with pytest.raises(TransitionNotAllowed):
        record.table.claim(pk="x", to=to, source={source})


@pytest.mark.django_db
def test_a_narrowed_source_must_be_allowed(alice, inputs):
    run = _make_run(alice.org, inputs, RunStatus.QUEUED)
    with pytest.raises(TransitionNotAllowed):
        run_transition(run=run, to=RunStatus.QUEUED, source={RunStatus.SUCCEEDED}, event="x")
    assert run_transition(run=run, to=RunStatus.CANCELLED, source={RunStatus.ACCEPTED}, event="x") is False
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("kind", "source", "to"),
    [
        ("run", "running", "cancelling"),
        ("trial", "pending", "waiting"),
        ("group", "pending", "settled"),
        ("lease", "active", "expired"),
        ("reservation", "waiting", "held"),
        ("trainer", "sampling", "updating"),
        ("update", "pending", "unresolved"),
        ("interaction.integrity", "staged", "published"),
    ],
)
def test_concurrent_claims_of_one_move_have_exactly_one_winner(alice, inputs, kind, source, to):
    assert connection.vendor == "postgresql"
    record = RECORDS[kind]
    obj = record.make(alice.org, inputs, source)
    before = record.events(obj) if record.events else None
    n = 12
    barrier = threading.Barrier(n)
    results: list[bool] = []
    lock = threading.Lock()

    def claim() -> None:
        try:
            barrier.wait()
            moved = record.move(type(obj).objects.get(pk=obj.pk), to)
            with lock:
                results.append(moved)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claim) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * (n - 1) + [True]
    assert record.status(obj) == to
    if record.events:
        assert record.events(obj) == before + 1


def test_nothing_outside_the_transition_functions_writes_a_status():
    """The grep the rule is checked by: no `.status = ...` or `update(status=...)` (nor the
    interaction's delivery/integrity) in application code except the transition modules."""
    allowed = {ROOT / "apps/core/transitions.py"}
    pattern = re.compile(
        r"\.(status|delivery|integrity)\s*=[^=]|update\([^)]*\b(status|delivery|integrity)\s*=|bulk_update\([^)]*\"status\""
    )
    offenders = []
    for path in (ROOT / "apps").rglob("*.py"):
        if path in allowed or "migrations" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def _claimed_fields(trial: Trial) -> dict[str, Any]:
    row = Trial.objects.get(pk=trial.pk)
    return {
        name: getattr(row, name)
        for name in ("status", "rewards", "reward", "error_type", "error_message", "timings", "finished_at", "tries")
    }


@pytest.mark.django_db
def test_a_claim_is_one_prepared_update_that_writes_what_the_orms_update_writes(alice, inputs):
    """On PostgreSQL a claim runs as one statement built once per shape (apps.core.bulk.row_claim),
    not compiled by the ORM each time: the row it leaves is the row QuerySet.update leaves with
    the same values (JSON with every kind of value, a float, text, a time, NULL), and a lost
    race or an unmet condition still moves nothing."""
    from django.test.utils import CaptureQueriesContext

    from apps.core.bulk import row_claim

    assert connection.vendor == "postgresql"
    run = _run(alice.org, inputs)
    fast, orm = Trial.objects.filter(run=run).order_by("id")[:2]
    Trial.objects.filter(pk__in=[fast.pk, orm.pk]).update(status="running", worker_node="w1")
    now = timezone.now()
    values = {
        "rewards": {"reward": 0.25, "nested": [1, 2.5, None, True, 'caf\u00e9 \\ \t \n "q"']},
        "reward": 0.25,
        "error_type": "",
        "error_message": "line\nand 'quotes' \\N",
        "timings": {},
        "finished_at": now,
    }
    # Another holder's condition, or a status the move does not start from: nothing moves.
    assert TRIAL_TRANSITIONS.claim(pk=fast.pk, to="succeeded", values=values, where={"worker_node": "w2"}) is False
    assert TRIAL_TRANSITIONS.claim(pk=fast.pk, to="running", source=["waiting"], values=values) is False
    assert Trial.objects.get(pk=fast.pk).status == "running"

    with CaptureQueriesContext(connection) as queries:
        assert TRIAL_TRANSITIONS.claim(pk=fast.pk, to="succeeded", values=values, where={"worker_node": "w1"}) is True
    assert len(queries.captured_queries) == 1
    sql = queries.captured_queries[0]["sql"]
    assert sql.startswith('UPDATE "runs_trial" SET "status" = ') and '"runs_trial"."id"' not in sql  # not the ORM's
    sources = TRIAL_TRANSITIONS.sources_of(to="succeeded")
    Trial.objects.filter(pk=orm.pk, status__in=sources, worker_node="w1").update(status="succeeded", **values)
    assert _claimed_fields(fast) == _claimed_fields(orm)
    assert _claimed_fields(fast)["rewards"]["nested"][4] == 'caf\u00e9 \\ \t \n "q"'
    # The same move again: the row is no longer where it may start from.
    assert row_claim(model=Trial, pk=fast.pk, field="status", sources=sources, where={}, changes={"status": "x"}) == 0


@pytest.mark.django_db
def test_a_claim_the_prepared_statement_cannot_express_goes_through_the_orm(alice, inputs):
    """An expression, a lookup or a NULL condition, a model instance: row_claim declines them
    (None) and the claim is the ORM's update, with the same outcome."""
    from django.db.models import F

    from apps.core.bulk import row_claim

    run = _run(alice.org, inputs)
    trial = Trial.objects.filter(run=run).order_by("id").first()
    Trial.objects.filter(pk=trial.pk).update(status="running", tries=2)
    sources = TRIAL_TRANSITIONS.sources_of(to="failed")
    declined = [
        {"where": {}, "changes": {"status": "failed", "tries": F("tries") + 1}},
        {"where": {"tries__gte": 1}, "changes": {"status": "failed"}},
        {"where": {"queued_at": None}, "changes": {"status": "failed"}},
        {"where": {}, "changes": {"status": "failed", "run": run}},
    ]
    for shape in declined:
        assert row_claim(model=Trial, pk=trial.pk, field="status", sources=sources, **shape) is None
    assert Trial.objects.get(pk=trial.pk).status == "running"  # declining wrote nothing

    trial.refresh_from_db()
    assert TRIAL_TRANSITIONS.claim(
        pk=trial.pk, to="failed", values={"tries": F("tries") + 1}, where={"tries__gte": 2}, instance=trial
    )
    assert (trial.status, trial.tries) == ("failed", 3)  # the expression's value read back
    assert Trial.objects.filter(pk=trial.pk, status="failed", tries=3).exists()


@pytest.mark.django_db(transaction=True)
def test_claiming_many_rows_returns_exactly_the_ones_this_claim_moved(alice, inputs, monkeypatch):
    """claim_each (the proxy's batched settles): one UPDATE ... RETURNING on PostgreSQL that
    writes what the ORM's update writes; a row in a status the move does not start from is
    neither moved nor returned; two batches racing over the same rows each return only
    the rows they moved, and together every row once. Off the prepared path (a value the
    statement cannot express) the same rows come back, locked and moved by the ORM, or,
    without row locks (SQLite), claimed one by one."""
    from django.db.models import F
    from django.test.utils import CaptureQueriesContext

    assert connection.vendor == "postgresql"
    run = _run(alice.org, inputs)
    trials = list(Trial.objects.filter(run=run).order_by("id"))
    assert len(trials) >= 4
    ids = [t.pk for t in trials]
    Trial.objects.filter(pk__in=ids).update(status="running")
    Trial.objects.filter(pk=ids[0]).update(status="succeeded")  # already final: not moved
    values = {"error_message": "line\nand 'quotes'", "finished_at": timezone.now(), "rewards": {"r": [1, 0.5]}}
    with CaptureQueriesContext(connection) as queries:
        moved = TRIAL_TRANSITIONS.claim_each(pks=[*ids[:3], ids[1], "trl_gone"], to="failed", values=values)
    assert sorted(moved) == sorted(ids[1:3])
    assert len(queries.captured_queries) == 1 and "RETURNING" in queries.captured_queries[0]["sql"]
    # The twin written by the ORM's update with the same values reads back the same.
    sources = TRIAL_TRANSITIONS.sources_of(to="failed")
    Trial.objects.filter(pk=ids[3], status__in=sources).update(status="failed", **values)
    assert _claimed_fields(trials[1]) == _claimed_fields(trials[3])
    assert Trial.objects.get(pk=ids[0]).status == "succeeded"
    assert TRIAL_TRANSITIONS.claim_each(pks=ids, to="failed") == []  # nothing left to move
    assert TRIAL_TRANSITIONS.claim_each(pks=[], to="failed") == []

    # Racing batches over overlapping rows: each row is returned by exactly one of them.
    more = list(Trial.objects.filter(run=_run(alice.org, inputs, key="k2")).values_list("pk", flat=True))
    Trial.objects.filter(pk__in=more).update(status="running")
    n = 6
    barrier = threading.Barrier(n)
    lock = threading.Lock()
    won: list[Any] = []

    def claim(offset: int) -> None:
        try:
            barrier.wait()
            mine = TRIAL_TRANSITIONS.claim_each(pks=more[offset:] + more[:offset], to="cancelled")
            with lock:
                won.extend(mine)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == sorted(more)
    assert set(Trial.objects.filter(pk__in=more).values_list("status", flat=True)) == {"cancelled"}

    # An expression among the values: the ORM locks, reads and moves the same rows.
    Trial.objects.filter(pk__in=more).update(status="running", tries=1)
    Trial.objects.filter(pk=more[0]).update(status="succeeded")
    moved = TRIAL_TRANSITIONS.claim_each(pks=more, to="failed", values={"tries": F("tries") + 1})
    assert sorted(moved) == sorted(more[1:])
    assert set(Trial.objects.filter(pk__in=more[1:]).values_list("status", "tries")) == {("failed", 2)}

    monkeypatch.setattr(connection.features, "has_select_for_update", False)
    Trial.objects.filter(pk__in=more).update(status="running")
    Trial.objects.filter(pk=more[-1]).update(status="succeeded")
    tries = dict(Trial.objects.filter(pk__in=more).values_list("pk", "tries"))
    with CaptureQueriesContext(connection) as queries:
        moved = TRIAL_TRANSITIONS.claim_each(pks=more, to="failed", values={"tries": F("tries") + 1})
    assert sorted(moved) == sorted(more[:-1])
    assert len(queries.captured_queries) == len(more) and "FOR UPDATE" not in queries.captured_queries[0]["sql"]
    after = {
        pk: (status, n) for pk, status, n in Trial.objects.filter(pk__in=more).values_list("pk", "status", "tries")
    }
    assert after == {pk: ("succeeded", tries[pk]) if pk == more[-1] else ("failed", tries[pk] + 1) for pk in more}


@pytest.mark.django_db
def test_a_submissions_rows_are_written_as_save_writes_them_by_prepared_inserts(alice, inputs):
    """run_submit inserts its run and spec with apps.core.bulk.row_insert (prepared, without
    the ORM's per-row compile): the rows read back as save() writes the same instances, and
    a second submission under the same key still answers with the first run."""
    from django.test.utils import CaptureQueriesContext

    from apps.runs.models import RunSpec

    with CaptureQueriesContext(connection) as queries:
        run, created = run_submit(org=alice.org, user=None, idempotency_key="rows", body=inputs["body"])
    assert created
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("INSERT INTO")]
    assert [sql.split('"')[1] for sql in inserts[:2]] == ["runs_run", "runs_runspec"]
    assert all("%s" not in sql and "$1" in sql for sql in inserts[:2])  # bound by the server, not quoted in
    # The same instances written by save(): every column but the keys and times the same.
    stored_run = Run.objects.filter(pk=run.pk).values().get()
    stored_spec = RunSpec.objects.filter(run_id=run.pk).values().get()
    twin = Run.objects.get(pk=run.pk)
    twin.pk, twin.idempotency_key, twin._state.adding = None, "rows-twin", True
    twin.id = Run._meta.pk.get_default()
    twin.save(force_insert=True)
    spec = RunSpec.objects.get(run_id=run.pk)
    spec.run_id, spec._state.adding = twin.pk, True
    spec.save(force_insert=True)

    def comparable(row: dict, *keys: str) -> dict:
        return {k: v for k, v in row.items() if k not in keys}

    skip = ("id", "run_id", "idempotency_key", "created_at", "updated_at")
    assert comparable(Run.objects.filter(pk=twin.pk).values().get(), *skip) == comparable(stored_run, *skip)
    assert comparable(RunSpec.objects.filter(run_id=twin.pk).values().get(), *skip) == comparable(stored_spec, *skip)
    again, created = run_submit(org=alice.org, user=None, idempotency_key="rows", body=inputs["body"])
    assert (again.pk, created) == (run.pk, False)
