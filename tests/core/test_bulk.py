"""rows_copy on the real server: the rows COPY writes are the rows bulk_create writes."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.forms.models import model_to_dict

from apps.accounts.services import org_get_or_create
from apps.core.bulk import rows_copy
from apps.datasets.models import Dataset, DatasetVersion, DatasetVersionTask, TaskVersion
from apps.objects.services import object_put

pytestmark = pytest.mark.django_db


def _task_versions(*, org, tag: str, count: int) -> list[TaskVersion]:
    """Unsaved task versions whose fields hold every kind of value a push writes."""
    rows = []
    for i in range(count):
        archive = object_put(org=org, data=f"{tag}-{i}".encode())
        rows.append(
            TaskVersion(
                org=org,
                name=f"{tag}/task-{i}",
                digest=archive.sha256,
                archive=archive,
                config={"task": {"name": f"t{i}"}, "nested": [1, 2.5, None, True, 'caf\u00e9 \\ \t \n "q"']},
                instruction="tab\there, newline\nthere, backslash \\ and \\N, caf\u00e9",
                agent_timeout_sec=None if i % 2 else 12.5,
                verifier_timeout_sec=60.0 + i,
                cpus=0.5,
                memory_mb=512 + i,
                docker_image="" if i % 2 else "python:3.12-slim",
                has_dockerfile=bool(i % 2),
                has_solution=not i % 2,
                local_support=None if i % 3 else {"supported": True, "problems": [], "warnings": ["w"]},
            )
        )
    return rows


def _stored(pks: list[str]) -> list[dict]:
    return [
        {k: v for k, v in model_to_dict(tv).items() if k != "id"} | {"created": tv.created_at is not None}
        for tv in TaskVersion.objects.filter(pk__in=pks).order_by("name")
    ]


def test_copied_rows_are_the_rows_bulk_create_writes() -> None:
    assert connection.vendor == "postgresql"
    org = org_get_or_create(slug="bulk-copy")
    copied = _task_versions(org=org, tag="copy", count=7)
    created = _task_versions(org=org_get_or_create(slug="bulk-create"), tag="copy", count=7)
    rows_copy(objs=copied)
    TaskVersion.objects.bulk_create(created)
    mine = _stored([tv.pk for tv in copied])
    theirs = _stored([tv.pk for tv in created])
    assert len(mine) == 7
    for row in theirs:
        row["org"] = org.pk
        row["archive"] = next(r["archive"] for r in mine if r["name"] == row["name"])
    assert mine == theirs
    assert all(not tv._state.adding for tv in copied)


def test_a_conflict_is_skipped_only_when_asked_and_the_transaction_goes_on() -> None:
    org = org_get_or_create(slug="bulk-conflict")
    first = _task_versions(org=org, tag="c", count=3)
    rows_copy(objs=first[1:2])
    again = _task_versions(org=org, tag="c", count=3)  # the same digests: one is stored already
    with transaction.atomic():
        with pytest.raises(IntegrityError):
            rows_copy(objs=again)
        assert TaskVersion.objects.filter(org=org).count() == 1  # nothing of the failed COPY
        rows_copy(objs=again, ignore_conflicts=True)
    stored = dict(TaskVersion.objects.filter(org=org).values_list("digest", "pk"))
    assert sorted(stored) == sorted(tv.digest for tv in again)
    assert stored[first[1].digest] == first[1].pk  # the row stored first stays


def test_a_database_generated_key_is_left_to_its_sequence() -> None:
    org = org_get_or_create(slug="bulk-auto")
    tvs = _task_versions(org=org, tag="a", count=3)
    rows_copy(objs=tvs)
    dataset = Dataset.objects.create(org=org, name="d")
    version = DatasetVersion.objects.create(dataset=dataset, version="1", digest="0" * 64, task_count=3)
    rows_copy(
        objs=[DatasetVersionTask(dataset_version=version, position=i, task_version=tv) for i, tv in enumerate(tvs)]
    )
    DatasetVersionTask.objects.create(dataset_version=version, position=3, task_version=tvs[0])
    entries = list(version.entries.values_list("id", "position", "task_version_id"))
    assert [(p, t) for _, p, t in entries] == [(0, tvs[0].pk), (1, tvs[1].pk), (2, tvs[2].pk), (3, tvs[0].pk)]
    assert len({i for i, _, _ in entries}) == 4 and all(i is not None for i, _, _ in entries)


def _interaction(**extra):
    from apps.proxy.models import Interaction
    from apps.proxy.routes import DEFAULT_ROUTE, route_upsert

    return Interaction(
        org_id=org_get_or_create(slug="row-insert").id,
        route=route_upsert(**DEFAULT_ROUTE)[0],
        principal_kind="attempt",
        model_requested="qwen3",
        snapshot={"backend": "scripted", "nested": [1, 2.5, None, 'caf\u00e9 \\ "q"']},
        parse_errors=["a", {"b": 1}],
        timings={"total": 3.5},
        payload={"output_ids": [1, 2, 3], "text": "tab\there \\N caf\u00e9"},
        prompt_ids_packed=b"\x00\x01\xff\\N",
        prompt_shared=7,
        **extra,
    )


def test_a_row_insert_writes_the_row_save_writes_visibly_to_django() -> None:
    """row_insert (the proxy's staging path) writes what save(force_insert=True) writes,
    every kind of value included, through Django's cursor wrapper: the query is seen by
    Django's query capture and a duplicate key raises Django's IntegrityError."""
    from django.test.utils import CaptureQueriesContext

    from apps.core.bulk import row_insert
    from apps.proxy.models import Interaction

    mine, theirs = _interaction(), _interaction()
    with CaptureQueriesContext(connection) as queries:
        row_insert(obj=mine)
    assert len(queries) == 1 and "INSERT INTO" in queries.captured_queries[0]["sql"]
    theirs.save(force_insert=True)
    assert not mine._state.adding

    def stored(pk: str) -> dict:
        row = Interaction.objects.filter(pk=pk).values().get()  # every column
        row.pop("id")
        assert row.pop("created_at") is not None
        return row

    mine_row = stored(mine.pk)
    assert mine_row == stored(theirs.pk)
    assert bytes(mine_row["prompt_ids_packed"]) == b"\x00\x01\xff\\N" and mine_row["payload"]["text"].startswith(
        "tab\t"
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        row_insert(obj=_interaction(id=mine.pk))


def _prepared(marker: str) -> list[str]:
    """The statements this connection has prepared on the server whose text holds ``marker``."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s", [f"%{marker}%"])
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.parametrize("setting", [True, False])
def test_a_bound_cursor_prepares_only_when_asked_and_allowed(settings, setting: bool) -> None:
    """A statement is prepared on its connection when the caller asks and the deployment
    allows it (a pooler that does not track prepared statements needs them off); its values
    go as parameters either way, and the answers are the same."""
    from apps.core.bulk import bound_cursor

    if connection.vendor != "postgresql":
        pytest.skip("bound cursors are PostgreSQL's")
    settings.SYNTH_DB_PREPARED_STATEMENTS = setting
    marker = f"bound_probe_{'on' if setting else 'off'}"
    answers = []
    for prepared in (False, True, True):
        with bound_cursor(prepared=prepared) as cursor:
            cursor.execute(f"SELECT %s::int + 1 AS {marker}_{prepared}", [len(answers)])
            answers.append(cursor.fetchone()[0])
    assert answers == [1, 2, 3]
    assert not _prepared(f"{marker}_False")  # never asked
    assert len(_prepared(f"{marker}_True")) == (1 if setting else 0)  # once for its two executions


def test_a_prepared_statement_works_on_after_a_rollback_forgets_it() -> None:
    """A rolled-back savepoint makes psycopg drop what it prepared (the server may have lost
    it): the next execution prepares the statement again instead of failing."""
    from django.db import DatabaseError

    from apps.core.bulk import bound_cursor

    if connection.vendor != "postgresql":
        pytest.skip("bound cursors are PostgreSQL's")
    statement = "SELECT %s::int * 2 AS bound_probe_rollback"
    with bound_cursor(prepared=True) as cursor:
        cursor.execute(statement, [1])
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT 1 / 0")
    with bound_cursor(prepared=True) as cursor:
        cursor.execute(statement, [21])
        assert cursor.fetchone()[0] == 42
    assert len(_prepared("bound_probe_rollback")) == 1


def test_a_bound_cursor_replaces_a_kept_connection_the_server_ended_before_using_it() -> None:
    """A thread that keeps its connection between requests, tasks or proxy phases finds it
    ended by the server (a restart): its next bound cursor runs Django's health check first, as
    connection.cursor() does, and goes on a new connection instead of failing."""
    import select
    import threading

    from django.db import connections

    from apps.core.bulk import bound_cursor

    if connection.vendor != "postgresql":
        pytest.skip("bound cursors are PostgreSQL's")
    out: dict[str, object] = {}

    def kept_thread() -> None:
        own = connections["default"]  # this thread's own connection, as a kept one
        try:
            with bound_cursor(prepared=False) as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                ended = cursor.fetchone()[0]
            admin.execute("SELECT pg_terminate_backend(%s)", [ended])  # another backend ends it
            assert select.select([own.connection.fileno()], [], [], 30)[0], "the server did not end it"
            own.close_if_unusable_or_obsolete()  # the end of a request or phase: checked at next use
            with bound_cursor(prepared=True) as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                out["pids"] = (ended, cursor.fetchone()[0])
        except Exception as exc:  # noqa: BLE001 - reported by the test
            out["error"] = exc
        finally:
            own.close()

    # The test's connection is the main thread's; pytest-django lets the other thread use the
    # test database with a connection of its own.
    connection.ensure_connection()
    admin = connection.connection  # the main thread's psycopg connection, another backend
    settings_max_age = connections["default"].settings_dict["CONN_MAX_AGE"]
    connections["default"].settings_dict["CONN_MAX_AGE"] = 60
    try:
        worker = threading.Thread(target=kept_thread)
        worker.start()
        worker.join(60)
    finally:
        connections["default"].settings_dict["CONN_MAX_AGE"] = settings_max_age
    assert "error" not in out, out.get("error")
    ended, replaced = out["pids"]
    assert replaced != ended
