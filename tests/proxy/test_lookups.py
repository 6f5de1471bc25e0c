"""The proxy's cached lookups (apps.proxy.lookups) and its process's kept connections.

A fresh cached caller and route table read no database; a revocation, an expiry change or a
disabled route takes effect once the check interval has passed, however it was written. The
connections: a live proxy process answers calls on connections its database threads keep,
never more than one per thread, and replaces one the server ended without failing a call.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.accounts.models import ModelCredential
from apps.accounts.services import model_credential_revoke
from apps.proxy import lookups
from apps.proxy.errors import AuthenticationFailed
from apps.proxy.models import ModelRoute
from tests.conftest import make_member
from tests.proxy.conftest import TOKENIZER_DIR, assert_error, call, issue, make_route

ROOT = Path(__file__).resolve().parents[2]
CHECK_SECONDS = 1.0  # the default is 0.5; a slow machine must not make an entry stale mid-test


def body(model: str = "qwen3-attempt", *, stream: bool = False) -> dict[str, Any]:
    return {"model": model, "max_tokens": 8, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def cached(settings):
    """The caches on (the suite's settings read on every call), empty before and after."""
    settings.SYNTH_PROXY_LOOKUP_CHECK_SECONDS = CHECK_SECONDS
    lookups.lookups_clear()
    yield
    lookups.lookups_clear()


def past_the_check_interval() -> None:
    # Whatever was read or confirmed before this point is stale after it, by construction
    # (freshness is the time since the read began): not a timing assertion.
    time.sleep(CHECK_SECONDS * 1.5)


def refused_within(bound_seconds: float, request: Any) -> Any:
    """Poll until the call is refused (a 4xx), at most `bound_seconds`; the last reply."""
    deadline = time.monotonic() + bound_seconds
    while True:
        reply = request()
        if reply.status >= 400 or time.monotonic() > deadline:
            return reply
        time.sleep(0.05)


@pytest.mark.django_db
def test_a_fresh_cached_caller_and_route_table_read_no_database(cached, settings):
    settings.SYNTH_PROXY_LOOKUP_CHECK_SECONDS = 60  # fresh for the whole test
    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    secret = issue(member.org, "qwen3-attempt")
    assert call("/v1/models", secret=secret, method="get").status == 200
    with CaptureQueriesContext(connection) as queries:
        reply = call("/v1/models", secret=secret, method="get")
    assert reply.status == 200 and [m["id"] for m in reply.json()["data"]] == ["qwen3-attempt"]
    assert len(queries) == 0
    # A model call still stages and settles its interaction, and reads neither table.
    with CaptureQueriesContext(connection) as queries:
        assert call("/v1/messages", secret=secret, body=body()).status == 200
    tables = " ".join(q["sql"] for q in queries.captured_queries)
    assert ModelCredential._meta.db_table not in tables and ModelRoute._meta.db_table not in tables
    assert queries.captured_queries  # the interaction was written


@pytest.mark.django_db
def test_a_revoked_credential_is_refused_within_the_check_interval(cached):
    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    secret = issue(member.org, "qwen3-attempt")
    other = issue(member.org, "qwen3-attempt", trial="trl_other")
    for s in (secret, other):
        assert call("/v1/messages", secret=s, body=body()).status == 200
    model_credential_revoke(cred=ModelCredential.objects.get(trial_id="trl_test"))
    reply = refused_within(10, lambda: call("/v1/messages", secret=secret, body=body()))
    error = assert_error(reply, 401, "authentication_error")
    assert "revoked" in error["error"]["message"]
    # Past one interval after the revocation no call is served from the cache any more;
    # the other credential, confirmed by the same checks, still is.
    past_the_check_interval()
    assert_error(call("/v1/messages", secret=secret, body=body()), 401, "authentication_error")
    assert call("/v1/messages", secret=other, body=body()).status == 200


@pytest.mark.django_db
def test_a_bulk_revocation_and_an_expiry_change_take_effect(cached):
    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    first = issue(member.org, "qwen3-attempt", trial="trl_1")
    second = issue(member.org, "qwen3-attempt", trial="trl_2")
    for s in (first, second):
        assert call("/v1/models", secret=s, method="get").status == 200
    # Written around the service: an update of the rows.
    ModelCredential.objects.filter(trial_id="trl_1").update(revoked_at=timezone.now())
    ModelCredential.objects.filter(trial_id="trl_2").update(expires_at=timezone.now() - timedelta(seconds=1))
    past_the_check_interval()
    assert (
        "revoked"
        in assert_error(call("/v1/models", secret=first, method="get"), 401, "authentication_error")["error"]["message"]
    )
    assert (
        "expired"
        in assert_error(call("/v1/models", secret=second, method="get"), 401, "authentication_error")["error"][
            "message"
        ]
    )


@pytest.mark.django_db
def test_an_expired_cached_credential_is_refused_at_once(cached):
    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    secret = issue(member.org, "qwen3-attempt", ttl=timedelta(seconds=1))
    assert call("/v1/models", secret=secret, method="get").status == 200
    cred = ModelCredential.objects.get()
    while timezone.now() < cred.expires_at:  # the cached row's own expiry passes
        time.sleep(0.05)
    assert_error(call("/v1/models", secret=secret, method="get"), 401, "authentication_error")


@pytest.mark.django_db
def test_a_disabled_route_and_a_new_alias_take_effect(cached):
    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    secret = issue(member.org, "qwen3-attempt")
    assert call("/v1/messages", secret=member.secret, body=body("qwen3-attempt")).status == 200
    assert_error(call("/v1/messages", secret=member.secret, body=body("new-name")), 404, "not_found_error")
    make_route("qwen3-attempt", aliases=["new-name"])
    past_the_check_interval()
    assert call("/v1/messages", secret=member.secret, body=body("new-name")).status == 200
    ModelRoute.objects.filter(name="qwen3-attempt").update(inference_enabled=False)
    reply = refused_within(10, lambda: call("/v1/messages", secret=secret, body=body()))
    assert_error(reply, 404, "not_found_error")


@pytest.mark.django_db
def test_an_operator_token_is_not_served_past_the_interval(cached):
    from apps.accounts.models import ApiToken

    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    assert call("/v1/models", secret=member.secret, method="get").status == 200
    ApiToken.objects.update(revoked_at=timezone.now())
    past_the_check_interval()
    assert_error(call("/v1/models", secret=member.secret, method="get"), 401, "authentication_error")


# THE PROXY PROCESS'S CONNECTIONS
# ------------------------------------------------------------------------------


def _settings_in_process(env: dict[str, str]) -> dict[str, Any]:
    code = (
        "import json, django; from django.conf import settings; django.setup(); "
        "d = settings.DATABASES['default']; "
        "print(json.dumps({'pool': d.get('OPTIONS', {}).get('pool'), 'conn_max_age': d['CONN_MAX_AGE']}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "synth_project.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_only_the_proxy_process_on_postgresql_keeps_its_connections_without_a_pool(tmp_path):
    pg = {
        "DATABASE_URL": "postgres://u@127.0.0.1:5432/x",
        "SYNTH_DB_CONN_MAX_AGE": "60",
        "SYNTH_VAR_DIR": str(tmp_path),
    }
    assert _settings_in_process({**pg, "SYNTH_PROXY_PROCESS": "false"}) == {"pool": None, "conn_max_age": 60}
    proxy = _settings_in_process({**pg, "SYNTH_PROXY_PROCESS": "true", "SYNTH_PROXY_DB_CONN_MAX_AGE": "120"})
    assert proxy == {"pool": None, "conn_max_age": 120}
    assert _settings_in_process({**pg, "SYNTH_PROXY_PROCESS": "true"})["conn_max_age"] == 300
    sqlite = {"DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "SYNTH_VAR_DIR": str(tmp_path)}
    assert _settings_in_process({**sqlite, "SYNTH_PROXY_PROCESS": "true"}) == {"pool": None, "conn_max_age": 0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _backends(application_name: str) -> set[tuple[int, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, backend_start::text FROM pg_stat_activity WHERE application_name = %s", [application_name]
        )
        return {(pid, start) for pid, start in cursor.fetchall()}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_live_proxy_process_opens_no_connection_per_call(tmp_path):
    """Its database threads keep their connections, one per slot at most, and replace one
    the server ended before a call uses it."""
    if connection.vendor != "postgresql":
        pytest.skip("kept connections are PostgreSQL's")
    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    secret = issue(member.org, "qwen3-attempt")
    db = connection.settings_dict
    app_name = f"synth-proxy-kept-test-{os.getpid()}"
    port = _free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "synth_project.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "PGAPPNAME": app_name,  # libpq's: names this process's connections
        "SYNTH_PROXY_DB_SLOTS": "3",
        "SYNTH_PROXY_LOOKUP_CHECK_SECONDS": "0.5",
        "SYNTH_TOKENIZER_DIR": str(TOKENIZER_DIR),
        "SYNTH_VAR_DIR": str(tmp_path),
        "CELERY_BROKER_URL": "filesystem://",  # the evidence messages stay under tmp_path
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "synth_project.proxy_asgi:application", "--port", str(port)]
        + ["--host", "127.0.0.1", "--log-level", "warning"],
        cwd=ROOT,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, "the proxy exited"
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.1)

        def post(client: httpx.Client, *, stream: bool) -> int:
            return client.post(
                f"{base}/v1/messages", json=body(stream=stream), headers={"x-api-key": secret}, timeout=60
            ).status_code

        with httpx.Client() as client:
            # Warm: the database threads that ran a phase open their connections.
            assert [post(client, stream=False) for _ in range(2)] == [200, 200]
            before = _backends(app_name)
            assert 1 <= len(before) <= 3
            # Then the connections stay open, call after call: a thread that runs its first
            # phase opens one (at most one per thread), none is closed or replaced.
            assert [post(client, stream=i % 2 == 0) for i in range(10)] == [200] * 10
            after = _backends(app_name)
            assert before <= after and len(after) <= 3

        async def burst() -> list[int]:
            async with httpx.AsyncClient() as client:

                async def one() -> int:
                    reply = await client.post(
                        f"{base}/v1/messages", json=body(), headers={"x-api-key": secret}, timeout=60
                    )
                    return reply.status_code

                return list(await asyncio.gather(*(one() for _ in range(16))))

        assert asyncio.run(burst()) == [200] * 16
        kept = _backends(app_name)
        assert after <= kept and len(kept) <= 3  # one per database thread: SYNTH_PROXY_DB_SLOTS

        # The server ends every kept connection, as a restart does: the check before a
        # phase's first query (a poll of the socket, apps.core.postgresql) finds its thread's
        # connection ended and opens a new one, so no call fails.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity WHERE application_name = %s",
                [app_name],
            )
        with httpx.Client() as client:
            assert [post(client, stream=i % 2 == 0) for i in range(6)] == [200] * 6
        assert _backends(app_name) and _backends(app_name).isdisjoint(kept)
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.django_db(transaction=True)
def test_stale_callers_found_at_once_are_confirmed_by_one_query(cached):
    # Calls that find their cached callers stale together wait for one confirmation
    # instead of each confirming every stale entry again (a herd of the same query).
    import threading

    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    secrets = [issue(member.org, "qwen3-attempt", trial=f"trl_{n}") for n in range(8)]
    for secret in secrets:
        lookups.caller_load(secret=secret)
    past_the_check_interval()
    confirms: list[str] = []
    start = threading.Barrier(len(secrets))

    def record(execute, sql, params, many, context):
        if ModelCredential._meta.db_table in sql:
            confirms.append(sql)
        return execute(sql, params, many, context)

    def load(secret: str) -> None:
        try:
            with connection.execute_wrapper(record):
                start.wait()
                lookups.caller_load(secret=secret)
        finally:
            connection.close()

    threads = [threading.Thread(target=load, args=(secret,)) for secret in secrets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(confirms) == 1, confirms
    assert all(lookups.caller_cached(secret=secret) is not None for secret in secrets)


@pytest.mark.django_db
def test_credentials_are_confirmed_as_the_orm_reads_them_in_one_statement():
    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    for n in range(4):
        issue(member.org, "qwen3-attempt", trial=f"trl_{n}")
    ids = sorted(ModelCredential.objects.values_list("id", flat=True))
    ModelCredential.objects.filter(trial_id="trl_1").update(revoked_at=timezone.now())
    ModelCredential.objects.filter(trial_id="trl_2").update(expires_at=timezone.now() - timedelta(seconds=1))
    asked = [*ids, "mcr_gone"]
    expected = dict(
        ModelCredential.objects.filter(id__in=asked, revoked_at__isnull=True).values_list("id", "expires_at")
    )
    assert len(expected) == 3  # the revoked one and the unknown id are not live; the expired one is
    with CaptureQueriesContext(connection) as queries:
        live = lookups.credentials_live(ids=asked)
    # The same ids and the same expiry instants, compared as the cache compares them.
    assert live == expected
    assert all(live[i] == expected[i] and live[i].utcoffset() is not None for i in live)
    assert len(queries) == 1
    if connection.vendor == "postgresql":
        # One parameter for every id, not one each (the ORM's IN list).
        assert "string_to_array" in queries[0]["sql"] and " IN (" not in queries[0]["sql"]
    # An id with a comma could not travel joined: the ORM confirms that list, to the same answer.
    with CaptureQueriesContext(connection) as queries:
        assert lookups.credentials_live(ids=[*ids, "mcr_a,b"]) == expected
    assert " IN (" in queries[0]["sql"]


class Clock:
    """The lookups' monotonic clock, moved by hand: freshness without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.mark.django_db
def test_callers_in_use_and_the_routes_are_confirmed_ahead_and_never_go_stale(cached, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(lookups, "time", clock)
    monkeypatch.setattr("synth_common.fresh_cache.time", clock)
    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    used, idle, revoked = (issue(member.org, "qwen3-attempt", trial=f"trl_{n}") for n in range(3))
    lookups.caller_load(secret=idle)
    clock.now += lookups.CALLER_ACTIVE_SECONDS + 1  # idle since: out of the window of callers in use
    for secret in (used, revoked):
        lookups.caller_load(secret=secret)
    lookups.routes_load()

    # Before half the interval: nothing to confirm, and no query.
    clock.now += CHECK_SECONDS * 0.4
    assert lookups.caller_cached(secret=used) is not None
    with CaptureQueriesContext(connection) as queries:
        lookups.lookups_confirm_ahead()
    assert len(queries) == 0

    # Past half of it: the entries in use are confirmed (one query), the revoked one dropped,
    # the idle one left stale; the route table is read again.
    clock.now += CHECK_SECONDS * 0.2
    assert lookups.caller_cached(secret=revoked) is not None
    model_credential_revoke(cred=lookups.caller_cached(secret=revoked).credential)
    with CaptureQueriesContext(connection) as queries:
        lookups.lookups_confirm_ahead()
        lookups.lookups_confirm_ahead()  # at most once per half interval
    tables = [q["sql"] for q in queries]
    assert len(tables) == 2 and ModelCredential._meta.db_table in tables[0] and ModelRoute._meta.db_table in tables[1]
    assert lookups.caller_cached(secret=revoked) is None  # refused from the database now

    # Past the interval since the first read: the confirmed caller and routes are still
    # fresh (served with no query), the idle one is stale.
    clock.now += CHECK_SECONDS * 0.6
    with CaptureQueriesContext(connection) as queries:
        assert lookups.caller_cached(secret=used) is not None
        assert lookups.routes_cached() is not None
        assert lookups.caller_cached(secret=idle) is None
    assert len(queries) == 0


@pytest.mark.django_db(transaction=True)  # the settle's phase may run on a connection of its own
@pytest.mark.parametrize("stream", [False, True])
def test_a_settled_call_confirms_its_caller_ahead(cached, monkeypatch, stream):
    """The phase that settles a model call also confirms ahead: a session that keeps
    calling finds its caller fresh, call after call, however long it runs."""
    clock = Clock()
    monkeypatch.setattr(lookups, "time", clock)
    monkeypatch.setattr("synth_common.fresh_cache.time", clock)
    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    secret = issue(member.org, "qwen3-attempt")
    for _ in range(4):
        assert call("/v1/messages", secret=secret, body=body(stream=stream)).status == 200
        clock.now += CHECK_SECONDS * 0.6  # each call more than half the interval after the last
        assert lookups.caller_cached(secret=secret) is not None


@pytest.mark.django_db
def test_a_caller_calling_less_often_than_the_interval_stays_confirmed(cached, monkeypatch):
    """An agent calls its model every few seconds, not every half interval: its entry is
    still confirmed ahead while other calls settle, and each of its calls is served from the
    cache with no query of its own."""
    clock = Clock()
    monkeypatch.setattr(lookups, "time", clock)
    monkeypatch.setattr("synth_common.fresh_cache.time", clock)
    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    seldom = issue(member.org, "qwen3-attempt", trial="trl_seldom")
    lookups.caller_load(secret=seldom)
    for _ in range(6):  # another session's calls settle every 0.6 interval; this one called once
        clock.now += CHECK_SECONDS * 0.6
        lookups.lookups_confirm_ahead()
    with CaptureQueriesContext(connection) as queries:
        assert lookups.caller_cached(secret=seldom) is not None
    assert len(queries) == 0


class SlowConfirm:
    """Moves the lookups' clock past the interval while a credential confirmation runs: the
    query and the thread hop behind it on a loaded machine."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.credential_queries = 0

    def __call__(self, execute, sql, params, many, context):
        if ModelCredential._meta.db_table in sql:
            self.credential_queries += 1
            self.clock.now += CHECK_SECONDS * 2
        return execute(sql, params, many, context)


@pytest.mark.django_db
def test_a_confirmation_that_began_after_the_call_serves_it_however_long_it_took(cached, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(lookups, "time", clock)
    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    secret = issue(member.org, "qwen3-attempt")
    lookups.caller_load(secret=secret)
    clock.now += CHECK_SECONDS * 1.5  # stale: the next call confirms it
    slow = SlowConfirm(clock)
    with connection.execute_wrapper(slow):
        caller = lookups.caller_load(secret=secret)
    # One confirming query, no full authentication (which would read the credential again).
    assert caller.credential is not None and slow.credential_queries == 1

    # A revocation is still refused: the confirmation reads it and drops the entry.
    clock.now += CHECK_SECONDS * 1.5
    model_credential_revoke(cred=caller.credential)
    with connection.execute_wrapper(slow), pytest.raises(AuthenticationFailed, match="revoked"):
        lookups.caller_load(secret=secret)


@pytest.mark.django_db
def test_calls_that_find_the_route_table_stale_together_share_one_read(cached, monkeypatch):
    """A burst of calls finding no fresh route table waits for one read of it, not one
    database phase each; a caller that goes away meanwhile does not cancel the others'."""
    from apps.proxy import exchange

    make_route("qwen3-attempt")
    reads: list[int] = []
    real_load = lookups.routes_load

    def counted_load():
        reads.append(1)
        return real_load()

    monkeypatch.setattr(lookups, "routes_load", counted_load)

    async def burst() -> list[Any]:
        callers = [asyncio.ensure_future(exchange.routes_current()) for _ in range(6)]
        await asyncio.sleep(0)  # every caller has found the table stale and waits
        callers[0].cancel()
        done = await asyncio.gather(*callers, return_exceptions=True)
        return done

    assert lookups.routes_cached() is None
    done = async_to_sync(burst)()
    assert isinstance(done[0], asyncio.CancelledError)
    assert [[r.name for r in routes] for routes in done[1:]] == [["qwen3-attempt"]] * 5
    assert reads == [1]
    assert [r.name for r in lookups.routes_cached()] == ["qwen3-attempt"]  # the one read filled it


@pytest.mark.django_db
def test_credentials_not_cached_found_together_are_read_in_one_query(cached):
    """A run's attempts start at once, each with a credential the process has not seen: the
    calls that miss together share one database phase and one query, and each still gets
    its own answer (a caller, or the refusal it would get alone)."""
    from apps.proxy import exchange

    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    secrets = [issue(member.org, "qwen3-attempt", trial=f"trl_{n}") for n in range(6)]
    revoked = issue(member.org, "qwen3-attempt", trial="trl_revoked")
    model_credential_revoke(cred=ModelCredential.objects.get(trial_id="trl_revoked"))
    forged = secrets[0][:-4] + "abcd"  # a known prefix, not its secret
    phases: list[int] = []
    real_load = lookups.callers_load

    def counted(*, secrets):
        phases.append(len(secrets))
        return real_load(secrets=secrets)

    class Request:
        def __init__(self, secret: str) -> None:
            self.headers = {"x-api-key": secret}

    async def burst() -> list[Any]:
        asked = [*secrets, secrets[1], revoked, forged]  # one secret twice
        return await asyncio.gather(
            *(exchange.authenticate(Request(secret)) for secret in asked), return_exceptions=True
        )

    with CaptureQueriesContext(connection) as queries:
        import unittest.mock

        with unittest.mock.patch.object(lookups, "callers_load", counted):
            answers = async_to_sync(burst)()
    credential_reads = [q for q in queries.captured_queries if ModelCredential._meta.db_table in q["sql"]]
    assert phases == [8] and len(credential_reads) == 1, (phases, credential_reads)
    trials = [a.credential.trial_id for a in answers[:7]]
    assert trials == [f"trl_{n}" for n in range(6)] + ["trl_1"]
    assert isinstance(answers[7], AuthenticationFailed) and "revoked" in answers[7].message
    assert isinstance(answers[8], AuthenticationFailed) and answers[8].message == "invalid x-api-key"
    # The callers found are cached as a load of each would have cached them; the refused are not.
    assert all(lookups.caller_cached(secret=secret) is not None for secret in secrets)
    assert lookups.caller_cached(secret=revoked) is None and lookups.caller_cached(secret=forged) is None


@pytest.mark.django_db
def test_a_credential_load_cancelled_before_its_phase_leaves_no_call_waiting(cached):
    """The loop closing cancels a load still gathering its batch: the calls waiting for it
    end cancelled, and a later miss for the same secret starts a load of its own."""
    from apps.proxy import exchange

    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    secret = issue(member.org, "qwen3-attempt")

    async def scenario() -> str:
        waiting = exchange._caller_loading(secret=secret)
        loads = exchange._caller_loads[asyncio.get_running_loop()]
        (load,) = loads.tasks
        await asyncio.sleep(0)  # the load has started: it yields once to gather the turn's misses
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)  # the load has ended
        assert waiting.cancelled()
        assert not loads.waiting and not loads.gathering
        caller = await exchange._caller_loading(secret=secret)  # a fresh load
        return caller.credential.trial_id

    assert async_to_sync(scenario)() == "trl_test"


@pytest.mark.django_db
def test_credentials_that_miss_while_a_load_runs_are_read_together_by_the_next(cached):
    """Sessions open over a few turns of the loop, not in one: one load runs at a time, and
    every credential that misses while its phase runs is read by the next phase, in one
    batch, instead of each turn's misses queueing a phase of their own."""
    import threading
    import unittest.mock

    from apps.proxy import exchange

    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    secrets = [issue(member.org, "qwen3-attempt", trial=f"trl_{n}") for n in range(5)]
    phases: list[list[str]] = []
    first_running, release = threading.Event(), threading.Event()
    real_load = lookups.callers_load

    def held(*, secrets):
        phases.append(list(secrets))
        if len(phases) == 1:  # the first load's phase runs until the later misses have arrived
            first_running.set()
            assert release.wait(30)
        return real_load(secrets=secrets)

    class Request:
        def __init__(self, secret: str) -> None:
            self.headers = {"x-api-key": secret}

    async def staggered() -> list[Any]:
        first = asyncio.ensure_future(exchange.authenticate(Request(secrets[0])))
        while not first_running.is_set():
            await asyncio.sleep(0.001)
        later = []
        for secret in secrets[1:]:  # one miss per turn of the loop, while the first phase runs
            later.append(asyncio.ensure_future(exchange.authenticate(Request(secret))))
            await asyncio.sleep(0)
        release.set()
        return await asyncio.gather(first, *later)

    with unittest.mock.patch.object(lookups, "callers_load", held):
        answers = async_to_sync(staggered)()
    assert phases == [secrets[:1], secrets[1:]]
    assert [a.credential.trial_id for a in answers] == [f"trl_{n}" for n in range(5)]
    loads = next(iter(exchange._caller_loads.values()), None)
    assert loads is None or (not loads.running and not loads.gathering and not loads.waiting)


@pytest.mark.django_db
def test_credentials_minted_lately_are_cached_before_their_first_call(cached, monkeypatch):
    """An attempt's first call finds its caller cached: the proxy's timer phase caches the
    credentials in force minted since its last look (and the route table), and confirms them
    ahead with the callers in use until they are called, so a revocation still takes effect."""
    from apps.accounts.services import token_hash
    from apps.core.ids import id_floor

    clock = Clock()
    monkeypatch.setattr(lookups, "time", clock)
    monkeypatch.setattr(lookups, "MINTED_PAGE", 2)  # a look reads page after page
    member = make_member("team", "alice")
    make_route("qwen3-attempt")
    fresh, revoked, expired, old = (issue(member.org, "qwen3-attempt", trial=f"trl_{n}") for n in range(4))
    model_credential_revoke(cred=ModelCredential.objects.get(trial_id="trl_1"))
    ModelCredential.objects.filter(trial_id="trl_2").update(expires_at=timezone.now() - timedelta(seconds=1))
    # Minted before the first look's window (its id is of that time: ids are time-ordered).
    before = timezone.now() - timedelta(seconds=lookups.CALLER_ACTIVE_SECONDS + lookups.MINTED_OVERLAP_SECONDS + 60)
    ModelCredential.objects.filter(trial_id="trl_3").update(id=id_floor("mcr", at=before.timestamp()))

    lookups.lookups_keep_fresh()
    with CaptureQueriesContext(connection) as queries:
        caller = lookups.caller_cached(secret=fresh)
        assert caller is not None and caller.kind == "attempt" and caller.org == member.org
        assert caller.credential is not None and caller.credential.trial_id == "trl_0"
        assert [lookups.caller_cached(secret=s) for s in (revoked, expired, old)] == [None, None, None]
        assert lookups.routes_cached() is not None  # read by the same phase: a process's first call waits for neither
    assert len(queries) == 0
    # Those are read from the database on their first call, as before: refused, or served.
    for secret, refusal in ((revoked, "revoked"), (expired, "expired")):
        with pytest.raises(AuthenticationFailed, match=refusal):
            lookups.caller_load(secret=secret)
    assert lookups.caller_load(secret=old).credential.trial_id == "trl_3"

    # The next look reads those minted since it began, less the overlap: one minted now is
    # cached; one cached already is kept as it is.
    entry = lookups.callers._entries[token_hash(fresh)]
    later = issue(member.org, "qwen3-attempt", trial="trl_4")
    assert lookups.callers.minted_cache() == 1
    assert lookups.callers._entries[token_hash(fresh)] is entry
    assert lookups.caller_cached(secret=later) is not None

    # Not called yet, both are confirmed ahead as callers in use: a revocation takes effect,
    # and the other stays fresh past the interval since it was read.
    clock.now += CHECK_SECONDS * 0.6
    model_credential_revoke(cred=ModelCredential.objects.get(trial_id="trl_4"))
    lookups.lookups_keep_fresh()
    assert lookups.caller_cached(secret=later) is None
    clock.now += CHECK_SECONDS * 0.6
    assert lookups.caller_cached(secret=fresh) is not None

    # One never called counts as in use for MINTED_ACTIVE_SECONDS only (every process caches
    # every credential minted, and one serves it): then it is dropped; one served is still
    # confirmed.
    unserved = issue(member.org, "qwen3-attempt", trial="trl_5")
    lookups.lookups_keep_fresh()
    assert token_hash(unserved) in lookups.callers._entries
    clock.now += lookups.MINTED_ACTIVE_SECONDS + 1
    lookups.lookups_keep_fresh()
    assert lookups.caller_cached(secret=fresh) is not None
    assert lookups.caller_cached(secret=unserved) is None
    assert token_hash(unserved) not in lookups.callers._entries  # dropped, not kept stale
    assert lookups.caller_load(secret=unserved).credential.trial_id == "trl_5"  # read on its first call


@pytest.mark.django_db(transaction=True)  # the timer's phases run on the suite's sync thread
def test_a_proxy_process_caches_the_credentials_minted_while_it_runs(cached):
    """The timer a proxy process starts with its server (`exchange.lookups_tend`) caches a
    credential minted after it started, before any call names it."""
    from asgiref.sync import sync_to_async

    from apps.proxy import exchange

    member = make_member("team", "alice")
    make_route("qwen3-attempt")

    async def scenario() -> str:
        tending = asyncio.ensure_future(exchange.lookups_tend())
        try:
            await asyncio.sleep(0)
            secret = await sync_to_async(issue)(member.org, "qwen3-attempt")
            deadline = time.monotonic() + 60  # a bound on a hung timer, not a measure of it
            while (caller := lookups.caller_cached(secret=secret)) is None:
                assert not tending.done(), "the timer stopped"
                assert time.monotonic() < deadline, "the timer did not cache the credential"
                await asyncio.sleep(0.02)
            assert caller.credential is not None
            return caller.credential.trial_id
        finally:
            tending.cancel()

    assert async_to_sync(scenario)() == "trl_test"
