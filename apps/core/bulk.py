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
from django.core.exceptions import FieldDoesNotExist
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
    # This thread's connection, looked up once: each attribute of django.db.connection
    # looks it up again in a context-local store, a few microseconds each, and an event
    # append (a few hundred microseconds in all) passes here.
    db = transaction.get_connection()
    # As connection.cursor() begins: a kept connection the server ended (a restart) is
    # replaced here, before its first use in a request, task or phase, not found broken by it.
    db.close_if_health_check_failed()
    db.ensure_connection()
    cursor_class = _PreparedCursor if prepared and settings.SYNTH_DB_PREPARED_STATEMENTS else _UnpreparedCursor
    # What connection.cursor() makes around its own cursor (connection.make_cursor).
    wrapper = CursorDebugWrapper if db.queries_logged else CursorWrapper
    return wrapper(cursor_class(db.connection), db)


@functools.cache
def _insert_statement(model: type[models.Model]) -> tuple[str, tuple[models.Field, ...]]:
    opts = model._meta
    fields = tuple(f for f in opts.concrete_fields if f is not opts.auto_field)
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in fields)
    return f"INSERT INTO {quote(opts.db_table)} ({columns}) VALUES ({', '.join(['%s'] * len(fields))})", fields


def row_insert(*, obj: models.Model, prepared: bool = False) -> None:
    """Insert ``obj`` (a new instance whose key is set, of a model with no save() of its own
    and no signal receivers) as ``obj.save(force_insert=True)`` writes it.

    For a row written on every model call (the proxy's staged interaction): save() builds
    its SQL through the compiler each time, and psycopg's client-side binding quotes every
    value into the statement's text, the staged payload's kilobytes of JSON included. Here
    the statement is built once per model and, on PostgreSQL, sent with its values as
    parameters (server-side binding). The values are those an INSERT of each field would
    write (pre_save fills auto_now_add times; get_db_prep_save adapts JSON, bytes, keys).
    ``prepared``: as ``bound_cursor``'s, for a row a process inserts over and over."""
    model = type(obj)
    if connection.vendor != "postgresql" or obj._meta.auto_field is not None and obj.pk is None:
        obj.save(force_insert=True)
        return
    statement, fields = _insert_statement(model)
    values = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
    with bound_cursor(prepared=prepared) as cursor:
        cursor.execute(statement, values)
    obj._state.adding, obj._state.db = False, connection.alias


# A claim's statement, built once per shape. The status values it may start from are
# placeholders of their own, so a shape is (model, status field, how many of them, the
# extra conditions' fields, the fields it sets).
@functools.cache
def _claim_statement(
    model: type[models.Model],
    field: str,
    sources: int,
    where: tuple[str, ...],
    changes: tuple[str, ...],
    many: bool = False,
) -> tuple[str, tuple[models.Field, ...], tuple[models.Field, ...]] | None:
    """(statement, fields set, fields compared after the key), or None if a field is one
    ``QuerySet.update`` treats otherwise (a parent model's, a many-to-many, one with a
    placeholder of its own): those claims go through the ORM. ``many``: the keys are one
    array parameter and the statement returns the keys of the rows it moved."""
    opts = model._meta

    def plain(name: str) -> models.Field | None:
        try:
            f = opts.get_field(name)
        except FieldDoesNotExist:  # the ORM's update says what is wrong
            return None
        if not isinstance(f, models.Field) or not f.concrete or f.many_to_many or hasattr(f, "get_placeholder"):
            return None
        return f if f.model._meta.concrete_model is opts.concrete_model else None

    set_fields: list[models.Field] = []
    compared: list[models.Field] = []
    for names, out in ((changes, set_fields), ((field, *where), compared)):
        for name in names:
            if (f := plain(name)) is None:
                return None
            out.append(f)
    quote = connection.ops.quote_name
    conditions = [
        f"{quote(opts.pk.column)} = ANY(%s)" if many else f"{quote(opts.pk.column)} = %s",
        f"{quote(compared[0].column)} IN ({', '.join(['%s'] * sources)})",
        *(f"{quote(f.column)} = %s" for f in compared[1:]),
    ]
    assignments = ", ".join(f"{quote(f.column)} = %s" for f in set_fields)
    statement = f"UPDATE {quote(opts.db_table)} SET {assignments} WHERE {' AND '.join(conditions)}"
    if many:
        statement += f" RETURNING {quote(opts.pk.column)}"
    return statement, tuple(set_fields), tuple(compared)


def _plain_value(value: Any) -> bool:
    # An expression (F(), Coalesce()) is computed by the database, a model instance stands for
    # its key: the ORM compiles those.
    return not hasattr(value, "resolve_expression") and not hasattr(value, "prepare_database_save")


def row_claim(
    *,
    model: type[models.Model],
    pk: Any,
    field: str,
    sources: frozenset[str],
    where: dict[str, Any],
    changes: dict[str, Any],
) -> int | None:
    """Rows updated by ``filter(pk=pk, <field>__in=sources, **where).update(**changes)``, run
    as one prepared statement (apps.core.transitions: every status move is this UPDATE); None
    when the ORM must run it (not PostgreSQL, a lookup or NULL in ``where``, an expression or
    a model instance among the values, a field update() treats otherwise).

    The ORM compiled the same UPDATE on every claim: about 0.2 ms of the caller's CPU, more
    than the statement's own round trip on this machine, for the proxy's settle of every
    model call and every trial's, group's and run's moves. The values are those update()
    sends: get_db_prep_save for what is set, get_db_prep_value for what is compared."""
    if connection.vendor != "postgresql" or not sources:
        return None
    if any("__" in name or value is None or not _plain_value(value) for name, value in where.items()):
        return None
    if not all(_plain_value(value) for value in changes.values()):
        return None
    if "pk" in where or "pk" in changes:
        return None
    shape = _claim_statement(model, field, len(sources), tuple(where), tuple(changes))
    if shape is None:
        return None
    statement, set_fields, compared = shape
    params = [f.get_db_prep_save(value, connection) for f, value in zip(set_fields, changes.values(), strict=True)]
    params.append(model._meta.pk.get_db_prep_value(pk, connection, prepared=False))
    params.extend(compared[0].get_db_prep_value(s, connection, prepared=False) for s in sorted(sources))
    params.extend(
        f.get_db_prep_value(value, connection, prepared=False)
        for f, value in zip(compared[1:], where.values(), strict=True)
    )
    # As update() does: an error inside a transaction leaves it to be rolled back.
    with transaction.mark_for_rollback_on_error(), bound_cursor(prepared=True) as cursor:
        cursor.execute(statement, params)
        return cursor.rowcount


def rows_claim(
    *, model: type[models.Model], pks: Sequence[Any], field: str, sources: frozenset[str], changes: dict[str, Any]
) -> list[Any] | None:
    """The keys of the rows ``filter(pk__in=pks, <field>__in=sources).update(**changes)``
    moves, in one prepared statement that returns them (``UPDATE ... RETURNING``); None when
    the ORM must run it (as ``row_claim``). The keys travel as one array parameter, so a
    batch of any size is one statement shape, prepared once."""
    if connection.vendor != "postgresql" or not sources or not pks:
        return None
    if not all(_plain_value(value) for value in changes.values()) or "pk" in changes:
        return None
    shape = _claim_statement(model, field, len(sources), (), tuple(changes), many=True)
    if shape is None:
        return None
    statement, set_fields, compared = shape
    pk = model._meta.pk
    params = [f.get_db_prep_save(value, connection) for f, value in zip(set_fields, changes.values(), strict=True)]
    params.append([pk.get_db_prep_value(key, connection, prepared=False) for key in pks])
    params.extend(compared[0].get_db_prep_value(s, connection, prepared=False) for s in sorted(sources))
    with transaction.mark_for_rollback_on_error(), bound_cursor(prepared=True) as cursor:
        cursor.execute(statement, params)
        return [pk.to_python(row[0]) for row in cursor.fetchall()]
