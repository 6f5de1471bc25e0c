"""New rows written without the ORM's per-row machinery: many of one model at once (by
COPY on PostgreSQL, by bulk_create elsewhere), one row on a hot path (`row_insert`), or a
hot path's own statement (`bound_cursor`).

Django's bulk_create on PostgreSQL sends each batch as INSERT ... SELECT * FROM UNNEST(...),
whose arrays psycopg quotes in Python, value by value: for the 10,000 task versions of a
dataset push that was seconds of client CPU. COPY sends the rows in PostgreSQL's text
format, each value written by psycopg's own dumpers, in one statement.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import psycopg
from django.conf import settings
from django.db import IntegrityError, connection, models, transaction
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper


def rows_copy(*, objs: Sequence[models.Model], ignore_conflicts: bool = False, batch_size: int = 1000) -> None:
    """Insert a row for each of ``objs`` (new instances of one model), as
    ``bulk_create(objs, ignore_conflicts=..., batch_size=...)`` would, reading nothing back:
    an auto-incremented key is left to the database and not set on the instance.

    With ``ignore_conflicts``, a row that meets a unique constraint (another transaction's
    row) fails the COPY, which is rolled back to its savepoint; the rows then go through
    ``bulk_create(ignore_conflicts=True)``, which skips the conflicting ones. Call inside a
    transaction when the rows must commit with other writes."""
    if not objs:
        return
    model = type(objs[0])
    if connection.vendor != "postgresql":
        model._default_manager.bulk_create(objs, ignore_conflicts=ignore_conflicts, batch_size=batch_size)
        return
    opts = model._meta
    # A database-generated key (an AutoField) is the sequence's to fill, as bulk_create leaves it.
    fields = [f for f in opts.concrete_fields if f is not opts.auto_field]
    quote = connection.ops.quote_name
    statement = f"COPY {quote(opts.db_table)} ({', '.join(quote(f.column) for f in fields)}) FROM STDIN"
    try:
        with transaction.atomic(), connection.cursor() as cursor, connection.wrap_database_errors:
            # The psycopg cursor itself: Django's wrapper has no COPY; its error wrapper turns
            # psycopg's errors into Django's (a unique violation into IntegrityError).
            with cursor.cursor.copy(statement) as copy:
                for obj in objs:
                    # pre_save fills auto_now_add times; get_db_prep_save adapts the value as an
                    # INSERT of this field would (JSON as Jsonb, foreign keys as their ids).
                    copy.write_row([f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields])
    except IntegrityError:
        if not ignore_conflicts:
            raise
        model._default_manager.bulk_create(objs, ignore_conflicts=True, batch_size=batch_size)
        return
    for obj in objs:  # saved, as bulk_create leaves them
        obj._state.adding, obj._state.db = False, connection.alias


class _UnpreparedCursor(psycopg.Cursor[Any]):
    """Server-side binding, never a named prepared statement: a pooler in transaction mode
    may run the next execution on another server connection, where it would not exist."""

    def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None
    ) -> Any:
        return super().execute(query, params, prepare=False, binary=binary)


class _PreparedCursor(psycopg.Cursor[Any]):
    """Server-side binding, each statement prepared on its connection's first execution of
    it and only executed after (settings.SYNTH_DB_PREPARED_STATEMENTS)."""

    def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None
    ) -> Any:
        return super().execute(query, params, prepare=True, binary=binary)

    def _convert_query(self, query: Any, params: Any = None) -> Any:
        # psycopg keeps the statement it sent for Django's query log (last_executed_query)
        # only when it sends the text, not when it executes a prepared one by name.
        converted = super()._convert_query(query, params)
        self._query = converted
        return converted


def bound_cursor(*, prepared: bool) -> CursorWrapper:
    """A cursor on this thread's PostgreSQL connection that sends its values as parameters
    (server-side binding; Django's cursors quote them into the statement's text), in Django's
    wrapper all the same: its execute wrappers, query log and error translation (a unique
    violation into IntegrityError) apply as to any query. Use it as a context manager.

    ``prepared``: for a statement a process runs over and over (an event append): PostgreSQL
    parses and plans it once per connection instead of on every execution. It takes effect
    only with settings.SYNTH_DB_PREPARED_STATEMENTS, which a pooler that does not track
    prepared statements needs off."""
    connection.ensure_connection()
    cursor_class = _PreparedCursor if prepared and settings.SYNTH_DB_PREPARED_STATEMENTS else _UnpreparedCursor
    # What connection.cursor() makes around its own cursor (connection.make_cursor).
    wrapper = CursorDebugWrapper if connection.queries_logged else CursorWrapper
    return wrapper(cursor_class(connection.connection), connection)


@functools.cache
def _insert_statement(model: type[models.Model]) -> tuple[str, tuple[models.Field, ...]]:
    opts = model._meta
    fields = tuple(f for f in opts.concrete_fields if f is not opts.auto_field)
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in fields)
    return f"INSERT INTO {quote(opts.db_table)} ({columns}) VALUES ({', '.join(['%s'] * len(fields))})", fields


def row_insert(*, obj: models.Model) -> None:
    """Insert ``obj`` (a new instance whose key is set, of a model with no save() of its own
    and no signal receivers) as ``obj.save(force_insert=True)`` writes it.

    For a row written on every model call (the proxy's staged interaction): save() builds
    its SQL through the compiler each time, and psycopg's client-side binding quotes every
    value into the statement's text, the staged payload's kilobytes of JSON included. Here
    the statement is built once per model and, on PostgreSQL, sent with its values as
    parameters (server-side binding). The values are those an INSERT of each field would
    write (pre_save fills auto_now_add times; get_db_prep_save adapts JSON, bytes, keys)."""
    model = type(obj)
    if connection.vendor != "postgresql" or obj._meta.auto_field is not None and obj.pk is None:
        obj.save(force_insert=True)
        return
    statement, fields = _insert_statement(model)
    values = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
    with bound_cursor(prepared=False) as cursor:
        cursor.execute(statement, values)
    obj._state.adding, obj._state.db = False, connection.alias
