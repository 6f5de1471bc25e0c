"""Database phases that outlive a dropped connection (apps.core.db), on the real server:
the server itself ends the connection (pg_terminate_backend, what a restart does to every
client), nothing is restarted."""

from __future__ import annotations

import psycopg
import pytest
from django.db import IntegrityError, OperationalError, connection, transaction

from apps.accounts.models import Organization
from apps.core.db import db_retry

pytestmark = pytest.mark.django_db(transaction=True)


def _server_ends_this_connection() -> None:
    """ "terminating connection due to administrator command", as in a fast restart."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    s = connection.settings_dict
    with psycopg.connect(
        host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"] or "postgres", dbname=s["NAME"],
        autocommit=True,
    ) as admin:  # fmt: skip
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_a_write_whose_connection_died_is_repeated_on_a_new_one() -> None:
    calls = []

    def write() -> Organization:
        calls.append(1)
        if len(calls) == 1:
            _server_ends_this_connection()
        return Organization.objects.create(slug="after-drop")

    org = db_retry(write=write, what="test write", seconds=10)
    assert org.slug == "after-drop" and len(calls) == 2
    assert Organization.objects.filter(slug="after-drop").count() == 1


def test_a_write_that_committed_before_its_connection_died_is_not_repeated() -> None:
    calls = []

    def write() -> Organization:
        calls.append(1)
        org = Organization.objects.create(slug="committed-once")  # autocommit: on the server now
        if len(calls) == 1:
            _server_ends_this_connection()
            Organization.objects.count()  # the caller never hears that the write succeeded
        return org

    done = db_retry(
        write=write,
        what="test write",
        seconds=10,
        committed=lambda: Organization.objects.filter(slug="committed-once").exists(),
    )
    assert done is None and len(calls) == 1
    assert Organization.objects.filter(slug="committed-once").count() == 1


def test_errors_of_the_write_itself_are_not_retried() -> None:
    Organization.objects.create(slug="taken")
    calls = []

    def write() -> None:
        calls.append(1)
        Organization.objects.create(slug="taken")

    with pytest.raises(IntegrityError):
        db_retry(write=write, what="test write", seconds=10)
    assert len(calls) == 1


def test_it_gives_up_after_its_bound_with_the_last_error() -> None:
    calls = []

    def write() -> None:
        calls.append(1)
        _server_ends_this_connection()
        Organization.objects.count()

    with pytest.raises(OperationalError):
        db_retry(write=write, what="test write", seconds=0.5)
    assert len(calls) >= 2
    assert Organization.objects.count() == 0  # the connection is usable again afterwards


def test_inside_a_transaction_it_runs_once() -> None:
    calls = []
    with pytest.raises(OperationalError), transaction.atomic():

        def write() -> None:
            calls.append(1)
            _server_ends_this_connection()
            Organization.objects.count()

        db_retry(write=write, what="test write", seconds=10)
    assert len(calls) == 1


@pytest.fixture
def kept_connection(monkeypatch):
    """This thread's connection kept between phases (SYNTH_DB_CONN_MAX_AGE 60, as the
    workers deploy), with a count of Django's health-check pings on it (the real check runs)."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)
    connection.close()
    connection.ensure_connection()
    pings = []
    usable = connection.is_usable

    def counted() -> bool:
        pings.append(1)
        return usable()

    monkeypatch.setattr(connection, "is_usable", counted)
    yield pings
    connection.close()


def test_a_phase_on_a_live_kept_connection_makes_no_health_check_round_trip(kept_connection) -> None:
    backend = _backend()
    for _ in range(3):
        assert db_retry(write=lambda: Organization.objects.count(), what="test read", seconds=10) == 0
    assert kept_connection == [] and _backend() == backend


def test_a_phase_after_the_server_ended_the_kept_connection_runs_on_a_new_one(kept_connection) -> None:
    backend = _backend()
    _server_ends_this_connection()  # between two phases, as a restart does
    org = db_retry(write=lambda: Organization.objects.create(slug="after-restart"), what="test write", seconds=10)
    assert org is not None and org.slug == "after-restart"
    assert Organization.objects.filter(slug="after-restart").count() == 1
    assert _backend() != backend


def test_a_transaction_after_the_server_ended_the_kept_connection_commits_once_on_a_new_one(kept_connection) -> None:
    _server_ends_this_connection()
    calls = []

    def write() -> Organization:
        calls.append(1)
        with transaction.atomic():  # a phase of several statements, as a trial's claim
            org = Organization.objects.create(slug="in-a-transaction")
            Organization.objects.filter(pk=org.pk).update(slug="in-a-transaction-2")
        return org

    assert db_retry(write=write, what="test write", seconds=10) is not None
    assert len(calls) == 2  # the first attempt failed before anything committed
    assert list(Organization.objects.filter(slug__startswith="in-a-transaction").values_list("slug", flat=True)) == [
        "in-a-transaction-2"
    ]


# --------------------------------------------------------------------------- db_side_run


@pytest.fixture
def kept_connections(monkeypatch):
    """Connections kept between uses (SYNTH_DB_CONN_MAX_AGE 60, as the workers deploy); the
    side threads' are closed again after the test, so none outlives the test database."""
    from django.db import connections

    from apps.core.db import db_side_run

    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)
    lanes = {"test-a", "test-b"}
    yield lanes
    for lane in lanes:
        db_side_run(call=connections.close_all, lane=lane)


def _backend() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _in_a_new_thread(fn):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as thread:  # a thread of its own, gone after the call
        return thread.submit(fn).result(60)


def test_short_lived_threads_share_the_side_threads_kept_connection(kept_connections) -> None:
    from apps.core.db import db_side_run

    first = _in_a_new_thread(lambda: db_side_run(call=_backend, lane="test-a"))
    second = _in_a_new_thread(lambda: db_side_run(call=_backend, lane="test-a"))
    assert first == second  # one backend for both threads: none was started for the second
    assert first != _backend()  # not the caller's connection
    assert db_side_run(call=_backend, lane="test-b") != first  # a lane has its own


def test_without_kept_connections_a_side_call_leaves_none_open() -> None:
    from django.db import connections

    from apps.core.db import db_side_run

    assert connection.settings_dict["CONN_MAX_AGE"] == 0
    db_side_run(call=_backend, lane="test-a")
    assert db_side_run(call=lambda: connections["default"].connection, lane="test-a") is None


def test_a_side_call_returns_and_raises_what_its_call_does(kept_connections) -> None:
    from apps.core.db import db_side_run

    assert db_side_run(call=lambda: Organization.objects.create(slug="side").slug, lane="test-a") == "side"
    with pytest.raises(IntegrityError):
        db_side_run(call=lambda: Organization.objects.create(slug="side"), lane="test-a")
    # The failed statement did not leave the kept connection unusable.
    assert db_side_run(call=lambda: Organization.objects.filter(slug="side").count(), lane="test-a") == 1


def test_a_lane_does_not_wait_behind_another(kept_connections) -> None:
    """The call in lane a waits for an event only a call in lane b sets: with one thread
    for both lanes it would wait out its bound and report False."""
    import threading

    from apps.core.db import db_side_run

    set_by_b = threading.Event()
    results = {}
    a = threading.Thread(target=lambda: results.update(a=db_side_run(call=lambda: set_by_b.wait(60), lane="test-a")))
    a.start()
    db_side_run(call=set_by_b.set, lane="test-b")
    a.join(90)
    assert results == {"a": True}


def test_a_call_from_the_lanes_own_thread_runs_in_place(kept_connections) -> None:
    from apps.core.db import db_side_run

    outer = db_side_run(call=lambda: (_backend(), db_side_run(call=_backend, lane="test-a")), lane="test-a")
    assert outer[0] == outer[1]
