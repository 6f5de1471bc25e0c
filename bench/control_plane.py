"""Control-plane throughput on PostgreSQL: run submissions per second (through the HTTP
API served by gunicorn, several concurrent clients), event append rates (one per
transaction, and batched as a worker's bursts), event reads, a 10,000-trial cancel
(bench/cancel.py, in a subprocess) and a 10,000-task dataset push (the examples' task
shape, packed and uploaded as `synth dataset push` does).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/synth_bench .venv/bin/python bench/control_plane.py

Prints figures; asserts nothing; the last line is one JSON object: {"submissions_per_s",
"event_appends_per_s", "event_appends_batched_per_s", "cancel_10k_s", "push_10k_s"} (with
the load average; "submission_floor_per_s", the same server and clients answering GET
/healthz, the cheapest request there is; "gateway_cpu_ms_per_submission" and
"floor_cpu_ms_per_request", the gunicorn processes' CPU per request of each of the two;
"bare_commits_per_s", the floor of the appends one per transaction: one process committing
bare INSERTs as they run, as a lone append commits;
"event_appends_in_transaction_per_s" with its floor "bare_commits_in_transaction_per_s":
each append alone inside a transaction, BEGIN and COMMIT round trips included;
"event_appends_parallel_per_s" with its floor "bare_commits_parallel_per_s": --writers
processes appending at once, one event per transaction, against as many processes
committing bare INSERTs). The database named in
DATABASE_URL is created if missing and its tables are migrated; rows are left behind for
inspection.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/synth_bench")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/14")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")


def ensure_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def make_push_tasks(root: Path, n: int) -> None:
    """``n`` tasks of the examples' shape: copies of examples/tasks, each renamed."""
    shapes = sorted(p for p in (ROOT / "examples" / "tasks").iterdir() if (p / "task.toml").is_file())
    for i in range(n):
        shape = shapes[i % len(shapes)]
        task = root / f"{shape.name}-{i:05d}"
        shutil.copytree(shape, task)
        toml = task / "task.toml"
        suffix = f"-{i:05d}"
        text = re.sub(r'^(name = "[^"]+)"', rf'\1{suffix}"', toml.read_text(), count=1, flags=re.M)
        toml.write_text(text)


def cancel_bench(*, trials: int) -> float | None:
    """bench/cancel.py over ``trials`` trials (in its own process: it swaps the broker)."""
    tasks = max(1, trials // 4)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cancel.py"), "--tasks", str(tasks), "--attempts", "4"],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        print(f"cancel bench failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return None
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"cancel of {figures['trials']:,} trials: {figures['time_to_cancelled_s']:.2f} s to cancelled")
    return float(figures["time_to_cancelled_s"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=400)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--burst", type=int, default=50, help="events per batched append")
    parser.add_argument("--writers", type=int, default=8, help="processes appending at once")
    parser.add_argument("--cancel-trials", type=int, default=10_000, help="0: skip the cancel")
    parser.add_argument("--push-tasks", type=int, default=10_000, help="0: skip the push")
    args = parser.parse_args()

    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    ensure_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import transaction

    call_command("migrate", verbosity=0)
    from apps.accounts.services import membership_set, org_get_or_create, token_issue
    from apps.runs.models import Run
    from apps.runs.services import events_append

    # The gunicorn master's and workers' CPU seconds: throughput moves with a shared machine's
    # speed within minutes, the CPU a request costs much less, so a change is judged on both.
    from bench.proxy_load import cpu_seconds
    from tests.factories import make_dataset_version, make_profile_version

    stamp = str(int(time.time()))
    org = org_get_or_create(slug=f"bench-{stamp}")
    membership = membership_set(org=org, username=f"bench-{stamp}")
    secret = token_issue(org=org, user=membership.user).secret
    dsv = make_dataset_version(org=org, tasks=10)
    actor = make_profile_version(org=org)
    body = {
        "kind": "evaluate",
        "dataset": dsv.reference,
        "actor": {"profile": actor.profile.name, "version": actor.version},
        "plan": {"attempts_per_task": 4},
    }

    port = free_port()
    # Persistent database connections, as a production gateway runs.
    env = dict(os.environ, SYNTH_CELERY_EAGER="false", SYNTH_DB_CONN_MAX_AGE="60")
    server = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/gunicorn"),
            "synth_project.wsgi",
            "-b",
            f"127.0.0.1:{port}",
            "-w",
            "2",
            "-k",
            "gthread",
            "--threads",
            "8",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    import httpx

    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        headers = {"Authorization": f"Bearer {secret}"}
        latencies: list[float] = []
        figures: dict[str, float | None] = {}

        local = threading.local()

        def thread_client() -> httpx.Client:
            # One keep-alive client per thread: the figure is the server's, not TCP set-up's.
            if not hasattr(local, "client"):
                local.client = httpx.Client(base_url=base, headers=headers, timeout=60)
            return local.client

        def submit(i: int) -> int:
            t0 = time.perf_counter()
            resp = thread_client().post("/api/runs", json=body, headers={"Idempotency-Key": f"{stamp}-{i}"})
            latencies.append(time.perf_counter() - t0)
            return resp.status_code

        with ThreadPoolExecutor(args.clients) as pool:
            # Warm-up, not timed: every client's connection and the server threads it
            # reaches (each with its database connection) set up, as they are in steady
            # state and for the floor measured after.
            list(pool.map(submit, range(-args.clients * 4, 0)))
            latencies.clear()
            cpu0 = cpu_seconds(server.pid)
            t0 = time.perf_counter()
            codes = list(pool.map(submit, range(args.submissions)))
        elapsed = time.perf_counter() - t0
        cpu_submission = (cpu_seconds(server.pid) - cpu0) / args.submissions
        assert all(c == 201 for c in codes), set(codes)
        lat = sorted(latencies)
        figures["submissions_per_s"] = round(args.submissions / elapsed, 1)
        figures["gateway_cpu_ms_per_submission"] = round(cpu_submission * 1000, 2)
        print(
            f"run submissions (HTTP, {args.clients} clients, gunicorn 2x8): "
            f"{args.submissions / elapsed:,.0f} runs/s; latency p50 {statistics.median(lat) * 1000:.1f} ms, "
            f"p99 {lat[int(len(lat) * 0.99) - 1] * 1000:.1f} ms; the gateway's CPU {cpu_submission * 1000:.2f} ms per run"
        )

        # The floor: the same server and clients answering the cheapest request there is
        # (GET /healthz: no authentication, one SELECT 1), as many times, right after.
        def health(_: int) -> int:
            return thread_client().get("/healthz").status_code

        cpu0 = cpu_seconds(server.pid)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            codes = list(pool.map(health, range(args.submissions)))
        elapsed = time.perf_counter() - t0
        cpu_health = (cpu_seconds(server.pid) - cpu0) / args.submissions
        assert all(c == 200 for c in codes), set(codes)
        figures["submission_floor_per_s"] = round(args.submissions / elapsed, 1)
        figures["floor_cpu_ms_per_request"] = round(cpu_health * 1000, 2)
        print(
            f"the floor, GET /healthz (no authentication, SELECT 1) on the same server and clients: "
            f"{args.submissions / elapsed:,.0f} requests/s; the gateway's CPU {cpu_health * 1000:.2f} ms per request"
        )

        # One event per transaction. An event that records no other write is its own
        # transaction: the append's one statement, committed as it runs (one round trip).
        # Inside a caller's transaction it costs two more round trips, BEGIN and COMMIT:
        # figures for both, each beside bare INSERTs committed the same way.
        run = Run.objects.filter(org=org).first()
        for in_transaction, suffix, how in (
            (False, "", "its own transaction"),
            (True, "_in_transaction", "alone in a transaction: BEGIN, append, COMMIT"),
        ):
            rate = appends_per_s(run_id=run.id, n=args.events, in_transaction=in_transaction)
            bare = bare_commits_per_s(n=min(args.events, 2000), in_transaction=in_transaction)
            figures[f"event_appends{suffix}_per_s"] = round(rate)
            figures[f"bare_commits{suffix}_per_s"] = round(bare)
            print(
                f"event append ({how}, one run): {rate:,.0f} events/s; "
                f"bare INSERTs committed the same way (same database and driver): {bare:,.0f}/s"
            )

        bursts = max(1, args.events * 4 // args.burst)
        t0 = time.perf_counter()
        for b in range(bursts):
            with transaction.atomic():
                events_append(
                    run_id=run.id, events=[("progress.tick", {"burst": b, "i": i}) for i in range(args.burst)]
                )
        elapsed = time.perf_counter() - t0
        figures["event_appends_batched_per_s"] = round(bursts * args.burst / elapsed)
        print(
            f"event append (batched, {args.burst} per transaction, one run): "
            f"{bursts * args.burst / elapsed:,.0f} events/s"
        )

        # Many writers at once, as a fleet's trials workers are: processes of their own (not
        # threads sharing one interpreter), each appending to its own run, one event per
        # transaction; side by side with the same number of processes committing bare
        # INSERTs. Concurrent commits share WAL flushes, and the round trips overlap.
        runs = list(Run.objects.filter(org=org).values_list("id", flat=True)[: args.writers])
        per = args.events // len(runs)
        parallel = writers_rate(kind="append", run_ids=runs, n=per)
        parallel_bare = writers_rate(kind="bare", run_ids=runs, n=per)
        figures["event_appends_parallel_per_s"] = round(parallel)
        figures["bare_commits_parallel_per_s"] = round(parallel_bare)
        print(
            f"event append ({len(runs)} processes, a run each, one per transaction): {parallel:,.0f} events/s; "
            f"bare INSERT + COMMIT from as many processes: {parallel_bare:,.0f}/s"
        )

        with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
            t0 = time.perf_counter()
            after, read = 0, 0
            while True:
                page = client.get(f"/api/runs/{run.id}/events", params={"after": after, "limit": 1000}).json()
                read += len(page["results"])
                after = page["after"]
                if not page["has_more"]:
                    break
            elapsed = time.perf_counter() - t0
            print(f"event read (HTTP pages of 1000): {read / elapsed:,.0f} events/s ({read} events)")

        figures["push_10k_s"] = None
        if args.push_tasks:
            figures["push_10k_s"] = push_bench(base=base, secret=secret, tasks=args.push_tasks, stamp=stamp)
    finally:
        server.terminate()
        server.wait(timeout=10)
    figures["cancel_10k_s"] = cancel_bench(trials=args.cancel_trials) if args.cancel_trials else None
    figures["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(figures))


def _writer(kind: str, run_id: str, n: int, barrier: Any, out: Any) -> None:
    """One writing process of writers_rate: set up, wait for the others, then time ``n``
    one-per-transaction writes (event appends to ``run_id``, or bare INSERTs)."""
    import django

    django.setup()
    from django.db import connection

    from apps.runs.events import event_append_alone

    connection.ensure_connection()
    barrier.wait()
    t0 = time.time()
    for i in range(n):
        if kind == "append":
            event_append_alone(run_id=run_id, type="progress.tick", data={"i": i})
        else:
            with connection.cursor() as cursor:
                cursor.execute("INSERT INTO bench_bare_commit (v) VALUES (%s)", [i])
    out.put((t0, time.time()))


def writers_rate(*, kind: str, run_ids: list[str], n: int) -> float:
    """Writes per second of one process per run, started together (set-up not timed)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier, out = context.Barrier(len(run_ids)), context.Queue()
    procs = [context.Process(target=_writer, args=(kind, run_id, n, barrier, out)) for run_id in run_ids]
    with bare_commit_table() if kind == "bare" else contextlib.nullcontext():
        try:
            for proc in procs:
                proc.start()
            spans = [out.get(timeout=600) for _ in procs]
        finally:
            for proc in procs:
                proc.join(timeout=60)
    return n * len(run_ids) / (max(end for _, end in spans) - min(start for start, _ in spans))


def appends_per_s(*, run_id: str, n: int, in_transaction: bool) -> float:
    """Event appends per second to one run, each its own transaction (``in_transaction``
    False: the append's one statement, committed as it runs) or alone in one."""
    from django.db import transaction

    from apps.runs.events import event_append, event_append_alone

    t0 = time.perf_counter()
    for i in range(n):
        if in_transaction:
            with transaction.atomic():
                event_append(run_id=run_id, type="progress.tick", data={"i": i})
        else:
            event_append_alone(run_id=run_id, type="progress.tick", data={"i": i})
    return n / (time.perf_counter() - t0)


def bare_commits_per_s(*, n: int, in_transaction: bool) -> float:
    """Plain INSERTs per second, each committed as it runs (``in_transaction`` False) or
    alone in a transaction (BEGIN, INSERT, COMMIT), through the same connection handling as
    the appends: their floors, side by side with them."""
    from django.db import connection, transaction

    with bare_commit_table():
        t0 = time.perf_counter()
        for i in range(n):
            with transaction.atomic() if in_transaction else contextlib.nullcontext(), connection.cursor() as cursor:
                cursor.execute("INSERT INTO bench_bare_commit (v) VALUES (%s)", [i])
        return n / (time.perf_counter() - t0)


@contextlib.contextmanager
def bare_commit_table() -> Iterator[None]:
    """The bare-INSERT floors' table, for the block: a regular one (a temporary table would
    skip the WAL, whose flush is what the floors measure), dropped after."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_bare_commit (id bigserial PRIMARY KEY, v integer)")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS bench_bare_commit")


def push_bench(*, base: str, secret: str, tasks: int, stamp: str) -> float | None:
    """Pack ``tasks`` tasks as the CLI does and push them in one request; seconds from
    the start of the upload to the server's answer."""
    import httpx

    from synth_cli.packing import pack_folder

    with tempfile.TemporaryDirectory(prefix="synth-bench-push-") as tmp:
        make_push_tasks(Path(tmp), tasks)
        t_pack = time.perf_counter()
        packed = pack_folder(Path(tmp))
        packed_s = time.perf_counter() - t_pack
        # The figure is the request's (upload, validation, storage): packing is the client's.
        t0 = time.perf_counter()
        resp = httpx.post(
            f"{base}/api/datasets",
            headers={"Authorization": f"Bearer {secret}"},
            data={"name": f"push-{stamp}", "version": "1"},
            files={"archive": ("dataset.tar.gz", packed.archive, "application/gzip")},
            timeout=1800,
        )
        elapsed = time.perf_counter() - t0
    if resp.status_code != 201:
        print(f"push of {tasks:,} tasks refused: {resp.status_code} {resp.text[:500]}")
        return None
    print(
        f"dataset push of {tasks:,} tasks ({packed.files:,} files, {len(packed.archive):,} bytes gzipped): "
        f"{elapsed:.1f} s in the request, {elapsed / tasks * 1000:.2f} ms per task (packing before it: {packed_s:.1f} s)"
    )
    return round(elapsed, 2)


if __name__ == "__main__":
    main()
