"""A run's ordered events: `seq` numbers from 1 without gaps, allocated under the run row's lock.

Allocating takes the run row's lock until commit (the UPDATE of `last_event_seq`), so the
events of one run commit in sequence order and a reader never sees seq N+1 before seq N.

On PostgreSQL an append is one statement: a data-modifying CTE bumps the run's counter
and the INSERT takes its seq from the CTE's RETURNING, so one event (or a burst of them)
costs one round trip and the run row is locked only from that statement to the commit.
Both statements are prepared on their connection (apps.core.bulk.bound_cursor): an append
is so short that parsing and planning it again each time was a sixth to a quarter of its cost.
SQLite has no data-modifying CTEs; there the bump and the insert are two statements
(its writers are serialized by the database lock anyway).

Inside ``run_locked`` (a caller that holds the run row's lock for a transaction of several
moves: a trial's claim, start or end) the run's events are held and appended in one
statement when the block ends, and transitions skip their own lock of the row: every round
trip made under that lock holds up every other writer of the run.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from apps.core.bulk import bound_cursor
from apps.core.errors import NotFound
from apps.runs.models import Run, RunEvent


def _tables() -> tuple[str, str]:
    quote = connection.ops.quote_name
    return quote(Run._meta.db_table), quote(RunEvent._meta.db_table)


@functools.cache
def _append_statement() -> str:
    """One event's append on PostgreSQL (made once: the same text every time, which is what
    its connection's prepared statement is found by)."""
    runs, events = _tables()
    return (
        f"WITH s AS (UPDATE {runs} SET last_event_seq = last_event_seq + 1 WHERE id = %s "
        "RETURNING last_event_seq) "
        f"INSERT INTO {events} (run_id, seq, type, data, created_at) "
        "SELECT %s, s.last_event_seq, %s, %s::jsonb, %s FROM s RETURNING id, seq"
    )


def _one_statement() -> bool:
    return connection.vendor == "postgresql"


def _seq_reserve(*, run_id: str, count: int) -> int:
    """Bump the run's last_event_seq by ``count``; returns the new value (the last seq)."""
    runs, _ = _tables()
    with connection.cursor() as cursor:
        # RETURNING (PostgreSQL, SQLite >= 3.35) saves the read-back.
        cursor.execute(
            f"UPDATE {runs} SET last_event_seq = last_event_seq + %s WHERE id = %s RETURNING last_event_seq",
            [count, run_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise NotFound(f"run {run_id} not found")
    return int(row[0])


def _atomic_check(name: str) -> None:
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError(f"{name} must be called inside transaction.atomic()")


def _loaded(*, pk: int, run_id: str, seq: int, type: str, data: dict[str, Any], created_at: Any) -> RunEvent:
    event = RunEvent(id=pk, run_id=run_id, seq=seq, type=type, data=data, created_at=created_at)
    event._state.adding = False
    event._state.db = connection.alias
    return event


# The runs whose row this thread's current transaction holds locked (run_locked), each with
# the events held for it, in order.
_held: ContextVar[dict[str, list[tuple[str, dict[str, Any]]]] | None] = ContextVar("synth_runs_locked", default=None)


def run_row_lock(*, run_id: str) -> None:
    """Lock the run's row (FOR NO KEY UPDATE) until the transaction ends; a no-op when a
    ``run_locked`` block of this thread holds it, or on SQLite (its writers are serialized
    by the database lock)."""
    if not connection.features.has_select_for_update or run_lock_held(run_id=run_id):
        return
    # Raw SQL: the ORM's compilation of the statement cost more than its round trip.
    runs, _ = _tables()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {runs} WHERE {connection.ops.quote_name(Run._meta.pk.column)} = %s FOR NO KEY UPDATE",
            [run_id],
        )


@contextmanager
def run_locked(*, run_id: str, lock: bool = False) -> Iterator[None]:
    """For a caller that has locked the run's row in its current transaction (or asks the
    block to lock it: ``lock``) and keeps the block inside that transaction: within the
    block, transitions of the run's records skip their own lock of the row
    (``run_lock_held``) and the run's events are held, then appended in one statement, in
    the order they were made, when the block ends without an error. Nested for the same run,
    the outer block appends. Code inside must not catch the error of a nested atomic block
    and go on: the events that block made would still be appended with the others."""
    _atomic_check("run_locked")
    held = _held.get() or {}
    if run_id in held:
        yield
        return
    if lock:
        run_row_lock(run_id=run_id)
    pending: list[tuple[str, dict[str, Any]]] = []
    token = _held.set({**held, run_id: pending})
    try:
        yield
        if pending:
            _events_insert(run_id=run_id, events=pending)
    finally:
        _held.reset(token)


def run_lock_held(*, run_id: str) -> bool:
    """Whether a ``run_locked`` block of this thread holds the run's row locked."""
    return run_id in (_held.get() or {})


def event_append(*, run_id: str, type: str, data: dict[str, Any] | None = None) -> RunEvent | None:
    """Append the run's next event. Must run inside the caller's transaction. Returns it,
    or None inside ``run_locked``, where it is appended with the block's others."""
    _atomic_check("event_append")
    data = data or {}
    pending = (_held.get() or {}).get(run_id)
    if pending is not None:
        pending.append((type, data))
        return None
    return _event_insert(run_id=run_id, type=type, data=data)


def event_append_alone(*, run_id: str, type: str, data: dict[str, Any] | None = None) -> RunEvent:
    """Append the run's next event as a transaction of its own, for an event that records no
    other write (a sweep's note). On PostgreSQL that is the append's one statement, committed
    as it runs: one round trip, where a transaction around it adds a BEGIN and a COMMIT, each
    a round trip of its own, and costs a third of the append's rate. Called inside a
    transaction it would not be on its own: an error says so (use event_append there)."""
    db = transaction.get_connection()
    if db.in_atomic_block:
        raise RuntimeError("event_append_alone must be called outside a transaction (use event_append inside one)")
    data = data or {}
    if db.vendor == "postgresql":
        return _event_insert(run_id=run_id, type=type, data=data)
    with transaction.atomic():  # SQLite's bump and insert are two statements
        return _event_insert(run_id=run_id, type=type, data=data)


def _event_insert(*, run_id: str, type: str, data: dict[str, Any]) -> RunEvent:
    if not _one_statement():
        seq = _seq_reserve(run_id=run_id, count=1)
        return RunEvent.objects.create(run_id=run_id, seq=seq, type=type, data=data)
    now = timezone.now()
    with bound_cursor(prepared=True) as cursor:
        cursor.execute(_append_statement(), [run_id, run_id, type, json.dumps(data), now])
        row = cursor.fetchone()
    if row is None:
        raise NotFound(f"run {run_id} not found")
    return _loaded(pk=row[0], run_id=run_id, seq=row[1], type=type, data=data, created_at=now)


def events_append(*, run_id: str, events: Sequence[tuple[str, dict[str, Any]]]) -> int:
    """Append many events of one run, in order, with one sequence bump (a worker's burst of
    progress, a batch of cancelled trials, a sweep). Must run inside the caller's transaction.
    On PostgreSQL the whole burst is one statement (inside ``run_locked``, part of the
    block's)."""
    _atomic_check("events_append")
    pending = (_held.get() or {}).get(run_id)
    if pending is not None:
        pending.extend(events)
        return len(events)
    return _events_insert(run_id=run_id, events=events)


def _events_insert(*, run_id: str, events: Sequence[tuple[str, dict[str, Any]]]) -> int:
    if not events:
        return 0
    if not _one_statement():
        last = _seq_reserve(run_id=run_id, count=len(events))
        first = last - len(events) + 1
        RunEvent.objects.bulk_create(
            [RunEvent(run_id=run_id, seq=first + i, type=etype, data=data) for i, (etype, data) in enumerate(events)],
            batch_size=1000,
        )
        return len(events)
    runs, table = _tables()
    with bound_cursor(prepared=True) as cursor:
        # unnest ... WITH ORDINALITY numbers the burst 1..n in the order given; the seqs are
        # the n values ending at the bumped counter.
        cursor.execute(
            f"WITH s AS (UPDATE {runs} SET last_event_seq = last_event_seq + %s WHERE id = %s "
            "RETURNING last_event_seq) "
            f"INSERT INTO {table} (run_id, seq, type, data, created_at) "
            "SELECT %s, s.last_event_seq - %s + e.n, e.type, e.data::jsonb, %s "
            "FROM s, unnest(%s::text[], %s::text[]) WITH ORDINALITY AS e(type, data, n)",
            [
                len(events),
                run_id,
                run_id,
                len(events),
                timezone.now(),
                [etype for etype, _ in events],
                [json.dumps(data or {}) for _, data in events],
            ],
        )
        inserted = cursor.rowcount
    if inserted == 0:
        raise NotFound(f"run {run_id} not found")
    return len(events)
