"""Many new rows of one model written at once: by COPY on PostgreSQL, by bulk_create elsewhere.

Django's bulk_create on PostgreSQL sends each batch as INSERT ... SELECT * FROM UNNEST(...),
whose arrays psycopg quotes in Python, value by value: for the 10,000 task versions of a
dataset push that was seconds of client CPU. COPY sends the rows in PostgreSQL's text
format, each value written by psycopg's own dumpers, in one statement.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import IntegrityError, connection, models, transaction


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
