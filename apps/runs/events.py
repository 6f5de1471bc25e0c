"""A run's ordered events: `seq` numbers from 1 without gaps, allocated under the run row's lock.

Allocating takes the run row's lock until commit (the UPDATE of `last_event_seq`), so the
events of one run commit in sequence order and a reader never sees seq N+1 before seq N.

On PostgreSQL an append is one statement: a data-modifying CTE bumps the run's counter
and the INSERT takes its seq from the CTE's RETURNING, so one event (or a burst of them)
costs one round trip and the run row is locked only from that statement to the commit.
SQLite has no data-modifying CTEs; there the bump and the insert are two statements
(its writers are serialized by the database lock anyway).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from apps.core.errors import NotFound
from apps.runs.models import Run, RunEvent


def _tables() -> tuple[str, str]:
    quote = connection.ops.quote_name
    return quote(Run._meta.db_table), quote(RunEvent._meta.db_table)


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


def event_append(*, run_id: str, type: str, data: dict[str, Any] | None = None) -> RunEvent:
    """Append the run's next event. Must run inside the caller's transaction."""
    _atomic_check("event_append")
    data = data or {}
    if not _one_statement():
        seq = _seq_reserve(run_id=run_id, count=1)
        return RunEvent.objects.create(run_id=run_id, seq=seq, type=type, data=data)
    runs, events = _tables()
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH s AS (UPDATE {runs} SET last_event_seq = last_event_seq + 1 WHERE id = %s "
            "RETURNING last_event_seq) "
            f"INSERT INTO {events} (run_id, seq, type, data, created_at) "
            "SELECT %s, s.last_event_seq, %s, %s::jsonb, %s FROM s RETURNING id, seq",
            [run_id, run_id, type, json.dumps(data), now],
        )
        row = cursor.fetchone()
    if row is None:
        raise NotFound(f"run {run_id} not found")
    return _loaded(pk=row[0], run_id=run_id, seq=row[1], type=type, data=data, created_at=now)


def events_append(*, run_id: str, events: Sequence[tuple[str, dict[str, Any]]]) -> int:
    """Append many events of one run, in order, with one sequence bump (a worker's burst of
    progress, a batch of cancelled trials, a sweep). Must run inside the caller's transaction.
    On PostgreSQL the whole burst is one statement."""
    _atomic_check("events_append")
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
    with connection.cursor() as cursor:
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
