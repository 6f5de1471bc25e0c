from __future__ import annotations

import json
import tempfile
import threading
import time

import httpx
import pytest
from django.db import connections, transaction

from apps.runs.models import Artifact, Lease, Reservation, RunEvent, SamplingGroup, Trial
from apps.runs.services import event_append, run_cancel


def test_events_page_in_order_from_a_cursor(db, alice, inputs):
    run_id = alice.client.post("/api/runs", inputs["body"], format="json").json()["id"]
    for i in range(7):
        with transaction.atomic():
            event_append(run_id=run_id, type="progress.tick", data={"i": i})
    page = alice.client.get(f"/api/runs/{run_id}/events?after=0&limit=3").json()
    assert [e["seq"] for e in page["results"]] == [1, 2, 3]
    assert page["has_more"] is True and page["after"] == 3
    seqs = [e["seq"] for e in page["results"]]
    while page["has_more"]:
        page = alice.client.get(f"/api/runs/{run_id}/events?after={page['after']}&limit=3").json()
        seqs += [e["seq"] for e in page["results"]]
    assert seqs == list(range(1, 9))
    assert alice.client.get(f"/api/runs/{run_id}/events?after=-1").status_code == 400


def _sse_events(response: httpx.Response):
    """Parse a server-sent event stream into dicts {id, event, data}."""
    event: dict[str, str] = {}
    for line in response.iter_lines():
        if line == "":
            if "data" in event:
                yield event
            event = {}
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_follow_resumes_after_a_dropped_connection_without_gap_or_duplicate(live_server, alice, inputs):
    run_id = alice.client.post("/api/runs", inputs["body"], format="json").json()["id"]
    total = 40

    def produce() -> None:
        try:
            for i in range(total):
                with transaction.atomic():
                    event_append(run_id=run_id, type="progress.tick", data={"i": i})
                time.sleep(0.01)
            run_cancel(org=alice.org, run_id=run_id, reason="end of test")
        finally:
            connections.close_all()

    producer = threading.Thread(target=produce)
    producer.start()
    url = f"{live_server.url}/api/runs/{run_id}/events"
    headers = {"Authorization": f"Bearer {alice.secret}"}
    seen: list[int] = []
    ended = False
    drops = 0
    with httpx.Client(timeout=30) as http:
        last_id = None
        while not ended:
            h = dict(headers)
            if last_id is not None:
                h["Last-Event-ID"] = last_id
            with http.stream("GET", url, params={"follow": 1}, headers=h) as resp:
                assert resp.status_code == 200
                assert resp.headers["content-type"].startswith("text/event-stream")
                for event in _sse_events(resp):
                    if event.get("event") == "end":
                        ended = True
                        assert json.loads(event["data"])["status"] == "cancelled"
                        break
                    seen.append(int(event["id"]))
                    last_id = event["id"]
                    # Drop the connection mid-stream, twice, as a flaky network would.
                    if len(seen) in (5, 17):
                        drops += 1
                        break
    producer.join()
    stored = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    assert drops == 2
    assert seen == stored  # every event once, in order, across both reconnects
    assert len(seen) == total + 2  # run.created + ticks + run.cancelled


@pytest.mark.django_db
def test_long_poll_returns_when_events_exist(alice, inputs):
    run_id = alice.client.post("/api/runs", inputs["body"], format="json").json()["id"]
    resp = alice.client.get(f"/api/runs/{run_id}/events?after=1&wait=0.5")
    assert resp.json()["results"] == []
    run_cancel(org=alice.org, run_id=run_id)
    page = alice.client.get(f"/api/runs/{run_id}/events?after=1&wait=5").json()
    assert [e["type"] for e in page["results"]] == ["run.cancelled"]
    assert page["ended"] is True


@pytest.mark.django_db
def test_a_burst_takes_the_next_seqs_in_order_between_single_appends(alice, inputs):
    from apps.runs.services import events_append

    run_id = alice.client.post("/api/runs", inputs["body"], format="json").json()["id"]  # seq 1: run.created
    with transaction.atomic():
        event_append(run_id=run_id, type="progress.tick", data={"i": "a"})
        assert events_append(run_id=run_id, events=[("progress.tick", {"i": n}) for n in range(5)]) == 5
        last = event_append(run_id=run_id, type="progress.tick", data={"i": "z"})
    assert last.seq == 8
    stored = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "data"))
    assert [seq for seq, _ in stored] == list(range(1, 9))
    assert [data.get("i") for _, data in stored[1:]] == ["a", 0, 1, 2, 3, 4, "z"]
    assert RunEvent.objects.get(run_id=run_id, seq=8).pk == last.pk
    from apps.runs.models import Run

    assert Run.objects.get(pk=run_id).last_event_seq == 8


@pytest.mark.django_db
def test_appends_to_a_missing_run_are_not_found(alice):
    from apps.core.errors import NotFound
    from apps.runs.services import events_append

    with transaction.atomic():
        with pytest.raises(NotFound):
            event_append(run_id="run_missing", type="progress.tick")
        with pytest.raises(NotFound):
            events_append(run_id="run_missing", events=[("progress.tick", {})])
    assert not RunEvent.objects.filter(run_id="run_missing").exists()


@pytest.mark.django_db
def test_an_append_is_one_statement_on_postgresql(alice, inputs):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.runs.services import events_append

    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no data-modifying CTEs: two statements there")
    run_id = alice.client.post("/api/runs", inputs["body"], format="json").json()["id"]
    with transaction.atomic():
        with CaptureQueriesContext(connection) as single:
            event_append(run_id=run_id, type="progress.tick", data={"i": 0})
        with CaptureQueriesContext(connection) as burst:
            events_append(run_id=run_id, events=[("progress.tick", {"i": n}) for n in range(100)])
    assert len(single.captured_queries) == 1
    assert len(burst.captured_queries) == 1
    assert RunEvent.objects.filter(run_id=run_id).count() == 102
    # Both statements are prepared on the connection: more appends parse and plan nothing.
    with transaction.atomic():
        for n in range(3):
            event_append(run_id=run_id, type="progress.tick", data={"i": n})
            events_append(run_id=run_id, events=[("progress.tick", {"i": n})] * 2)
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE '%%runs_runevent%%'")
        prepared = [row[0] for row in cursor.fetchall()]
    assert len(prepared) == 2 and sum("unnest" in statement for statement in prepared) == 1, prepared
    assert list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True)) == list(
        range(1, 112)
    )


@pytest.mark.django_db(transaction=True)
def test_a_lone_append_is_its_own_transaction_and_refuses_to_run_inside_one(alice, inputs):
    import psycopg
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.core.errors import NotFound
    from apps.runs.events import event_append_alone

    run_id = alice.client.post("/api/runs", inputs["body"], format="json").json()["id"]  # seq 1: run.created
    first = event_append_alone(run_id=run_id, type="progress.tick", data={"i": 0})
    if connection.vendor == "postgresql":
        # libpq's own trace of what goes on the wire: one statement, no BEGIN, no COMMIT.
        pgconn = connection.connection.pgconn
        with tempfile.TemporaryFile() as trace:
            pgconn.trace(trace.fileno())
            pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
            with CaptureQueriesContext(connection) as captured:
                second = event_append_alone(run_id=run_id, type="progress.tick", data={"i": 1})
            pgconn.untrace()
            trace.seek(0)
            sent = [line for line in trace.read().decode().splitlines() if line.startswith("F")]
        assert len(captured.captured_queries) == 1
        assert sum("Execute" in line for line in sent) == 1 and not any(
            "BEGIN" in line or "COMMIT" in line for line in sent
        ), sent
    else:
        second = event_append_alone(run_id=run_id, type="progress.tick", data={"i": 1})
    assert (first.seq, second.seq) == (2, 3)
    if connection.vendor == "postgresql":
        # Committed: no transaction is left open and another connection reads both events.
        assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        params = connection.get_connection_params()
        with psycopg.connect(**{k: v for k, v in params.items() if k not in {"cursor_factory", "context"}}) as other:
            seen = other.execute("SELECT seq, data FROM runs_runevent WHERE run_id = %s ORDER BY seq", [run_id])
            assert [(seq, data.get("i")) for seq, data in seen.fetchall()] == [(1, None), (2, 0), (3, 1)]
    # Inside a transaction it would not stand alone: an error, and nothing appended.
    with transaction.atomic():
        with pytest.raises(RuntimeError, match="outside a transaction"):
            event_append_alone(run_id=run_id, type="progress.tick")
    with pytest.raises(NotFound):
        event_append_alone(run_id="run_missing", type="progress.tick")
    assert list(RunEvent.objects.filter(run_id=run_id).values_list("seq", flat=True).order_by("seq")) == [1, 2, 3]


@pytest.mark.django_db
def test_a_submission_reads_no_row_twice(alice, inputs):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        resp = alice.client.post("/api/runs", inputs["body"], format="json", HTTP_IDEMPOTENCY_KEY="once")
    assert resp.status_code == 201
    body = resp.json()
    assert body["last_event_seq"] == 1 and body["actor"]["profile"] == inputs["actor"].profile.name
    sqls = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith("SELECT")]
    assert len(sqls) == len(set(sqls))
    # The Idempotency-Key is looked up only when the insert meets it, and the answer is not read back.
    assert not [s for s in sqls if 'FROM "runs_run"' in s]
    if connection.vendor == "postgresql":
        # Pinned so that it cannot creep back up: the token with its member's role, the
        # dataset version with its local support, the actor's version (3 reads); the run,
        # its spec and `run.created` (3 writes); the token's first use stamps last_used_at.
        # The test's transaction makes the submission's a savepoint (SAVEPOINT, RELEASE).
        statements = [q["sql"].split()[0] for q in ctx.captured_queries]
        assert statements == (
            ["SELECT", "UPDATE", "SELECT", "SELECT", "SAVEPOINT", "INSERT", "INSERT", "WITH", "RELEASE"]
        ), statements
    # A replay reads the stored run and answers the same.
    again = alice.client.post("/api/runs", inputs["body"], format="json", HTTP_IDEMPOTENCY_KEY="once")
    assert again.status_code == 200
    same = ("id", "kind", "dataset", "dataset_digest", "actor", "judge", "plan", "created_at")
    assert {k: again.json()[k] for k in same} == {k: body[k] for k in same}


@pytest.mark.parametrize("model", [RunEvent, Trial, Lease, SamplingGroup, Artifact, Reservation])
def test_no_index_is_a_prefix_of_another(db, model):
    # An index on columns another index leads with serves no query the other cannot, and
    # every write of the row maintains it: events are appended constantly, and a trial's
    # row, its lease, its reservation and its group change at its every transition.
    with connections["default"].cursor() as cursor:
        constraints = connections["default"].introspection.get_constraints(cursor, model._meta.db_table)
    # A partial index (a unique constraint with a condition) enforces what no other does.
    partial = {c.name for c in model._meta.constraints if getattr(c, "condition", None) is not None}
    indexes = [
        tuple(c["columns"])
        for name, c in constraints.items()
        if (c["index"] or c["unique"]) and c["columns"] and name not in partial
    ]
    redundant = [
        (short, long)
        for i, short in enumerate(indexes)
        for j, long in enumerate(indexes)
        if i != j and long[: len(short)] == short and (len(short) < len(long) or i > j)
    ]
    assert not redundant, redundant


@pytest.mark.django_db
def test_under_a_held_run_lock_events_wait_for_the_block_and_moves_lock_nothing_again(alice, inputs):
    """Inside run_locked a trial's moves lock no row of the run again, and the run's events,
    direct appends and transitions' alike, are appended when the block ends, in the order
    they were made, in one statement; a block that fails appends none."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.runs.events import run_locked
    from apps.runs.models import Run, TrialStatus
    from apps.runs.services import events_append
    from apps.runs.transitions import trial_transition
    from tests.runs.test_cancel import big_run

    run = big_run(alice, inputs, tasks=2, attempts=1)
    trials = list(Trial.objects.filter(run=run).order_by("pk"))
    before = Run.objects.get(pk=run.pk).last_event_seq
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        Run.objects.select_for_update(no_key=True).get(pk=run.pk)
        with run_locked(run_id=run.id):
            events_append(run_id=run.id, events=[("progress.first", {})])
            assert trial_transition(trial=trials[0], to=TrialStatus.CANCELLED, event="trial.cancelled")
            event_append(run_id=run.id, type="progress.last", data={})
            assert RunEvent.objects.filter(run=run, seq__gt=before).count() == 0  # held until the end
        appended = list(RunEvent.objects.filter(run=run, seq__gt=before).order_by("seq").values_list("type", flat=True))
    assert appended == ["progress.first", "trial.cancelled", "progress.last"]
    locks = [q["sql"] for q in queries.captured_queries if "FOR NO KEY UPDATE" in q["sql"]]
    assert len(locks) == 1  # the caller's own
    assert sum("INSERT INTO" in q["sql"] and "runs_runevent" in q["sql"] for q in queries.captured_queries) == 1
    with pytest.raises(RuntimeError), transaction.atomic(), CaptureQueriesContext(connection) as failed:
        Run.objects.select_for_update(no_key=True).get(pk=run.pk)
        with run_locked(run_id=run.id):
            event_append(run_id=run.id, type="progress.lost", data={})
            raise RuntimeError("the block fails")
    assert not any("runs_runevent" in q["sql"] for q in failed.captured_queries)  # nothing was written
