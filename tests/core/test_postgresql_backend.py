"""The check of a kept connection (apps.core.postgresql): no round trip for a quiet
connection, Django's query for one with something to read, and a failure (then a new
connection) for one the server ended or that is closed. On the real server; the server ends a connection with pg_terminate_backend,
what a restart does to every client, and nothing is restarted."""

from __future__ import annotations

import select
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

pytestmark = pytest.mark.django_db


def _url() -> str:
    s = connection.settings_dict
    return f"postgresql://{s['USER'] or 'postgres'}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def _last_query(admin: psycopg.Connection, pid: int) -> str | None:
    row = admin.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    return None if row is None else row[0]


@pytest.fixture
def kept() -> Iterator[tuple[object, psycopg.Connection]]:
    """A Django connection of this process' backend, as a gateway thread, a worker or one of
    the proxy's database threads keeps one between requests, and an admin connection
    watching it."""
    from django.db import connections

    if connection.vendor != "postgresql":
        pytest.skip("the backend is PostgreSQL's")
    wrapper = connections.create_connection("default")
    wrapper.ensure_connection()
    try:
        with psycopg.connect(_url(), autocommit=True) as admin:
            yield wrapper, admin
    finally:
        wrapper.close()


def test_the_health_check_of_a_quiet_kept_connection_makes_no_round_trip(kept):
    wrapper, admin = kept
    assert type(wrapper).__module__ == "apps.core.postgresql.base"  # what settings choose
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT 'the request before'")
    wrapper.health_check_done = False  # a new request's first use
    wrapper.close_if_health_check_failed()
    assert wrapper.connection is not None
    assert _last_query(admin, wrapper.connection.info.backend_pid) == "SELECT 'the request before'"


def test_a_kept_connection_the_server_ended_is_replaced_before_its_next_request(kept):
    wrapper, admin = kept
    ended = wrapper.connection.info.backend_pid
    admin.execute("SELECT pg_terminate_backend(%s)", [ended])
    assert select.select([wrapper.connection.fileno()], [], [], 30)[0], "the server did not end the connection"
    wrapper.health_check_done = False
    wrapper.close_if_health_check_failed()  # the check fails: Django closes it
    assert wrapper.connection is None
    with wrapper.cursor() as cursor:  # the request's first query opens a new one
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != ended


def test_a_kept_connection_with_something_to_read_is_checked_by_a_round_trip(kept):
    wrapper, admin = kept
    with wrapper.cursor() as cursor:
        cursor.execute("LISTEN kept_check_test")
    admin.execute("NOTIFY kept_check_test")
    assert select.select([wrapper.connection.fileno()], [], [], 30)[0], "the notification did not arrive"
    assert wrapper.is_usable()  # it reads what came and answers Django's query: still good
    assert _last_query(admin, wrapper.connection.info.backend_pid) == "SELECT 1"


def test_a_closed_kept_connection_is_not_usable(kept):
    wrapper, _ = kept
    wrapper.connection.close()
    assert not wrapper.is_usable()


def test_a_kept_connection_on_a_descriptor_above_select_s_limit_is_checked_like_any(kept):
    # A proxy serving hundreds of streams holds descriptors above 1024, select()'s limit:
    # the descriptors below are taken first, so the connection's socket lands above it.
    import os
    import resource

    from django.db import connections

    _, admin = kept
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip("this process may not open 2048 descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    taken: list[int] = []
    high = connections.create_connection("default")
    try:
        while not taken or taken[-1] < 1100:
            taken.append(os.open(os.devnull, os.O_RDONLY))
        with high.cursor() as cursor:
            cursor.execute("SELECT 'high'")
        assert high.connection.fileno() > 1024
        assert high.is_usable()  # quiet: no round trip, no error
        pid = high.connection.info.backend_pid
        assert _last_query(admin, pid) == "SELECT 'high'"
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        poller = select.poll()
        poller.register(high.connection.fileno(), select.POLLIN)
        assert poller.poll(30_000), "the server did not end the connection"
        assert not high.is_usable()
    finally:
        high.close()
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
