"""A run's ordered events: `seq` numbers from 1 without gaps, allocated under the run row's lock.

Allocating takes the run row's lock until commit (the UPDATE of `last_event_seq`), so the
events of one run commit in sequence order and a reader never sees seq N+1 before seq N.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection, transaction

from apps.core.errors import NotFound
from apps.runs.models import Run, RunEvent


def _seq_reserve(*, run_id: str, count: int) -> int:
    """Bump the run's last_event_seq by ``count``; returns the new value (the last seq)."""
    table = connection.ops.quote_name(Run._meta.db_table)
    with connection.cursor() as cursor:
        # One statement: RETURNING (PostgreSQL, SQLite >= 3.35) saves the read-back.
        cursor.execute(
            f"UPDATE {table} SET last_event_seq = last_event_seq + %s WHERE id = %s RETURNING last_event_seq",
            [count, run_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise NotFound(f"run {run_id} not found")
    return int(row[0])


def event_append(*, run_id: str, type: str, data: dict[str, Any] | None = None) -> RunEvent:
    """Append the run's next event. Must run inside the caller's transaction."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("event_append must be called inside transaction.atomic()")
    seq = _seq_reserve(run_id=run_id, count=1)
    return RunEvent.objects.create(run_id=run_id, seq=seq, type=type, data=data or {})


def events_append(*, run_id: str, events: Sequence[tuple[str, dict[str, Any]]]) -> int:
    """Append many events of one run with one sequence bump and one bulk insert (a batch of
    cancelled trials, a sweep). Must run inside the caller's transaction."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("events_append must be called inside transaction.atomic()")
    if not events:
        return 0
    last = _seq_reserve(run_id=run_id, count=len(events))
    first = last - len(events) + 1
    RunEvent.objects.bulk_create(
        [RunEvent(run_id=run_id, seq=first + i, type=etype, data=data) for i, (etype, data) in enumerate(events)],
        batch_size=1000,
    )
    return len(events)
