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
"client_cpu_ms_per_submission" and "floor_client_cpu_ms_per_request", this process's, where
the --clients clients run, of --client's library: "client" names it. On a 2-core machine the
clients share the CPU with the gateway and the database: httpx, the CLI's own, cost 1.2-1.7 ms
per request here, aiohttp 0.3-0.6 ms, which the floor feels more than the submissions;
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
import asyncio
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
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/synth_bench")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/14")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")

# The gunicorn master's and workers' CPU seconds (cpu_seconds): throughput moves with a shared
# machine's speed within minutes, the CPU a request costs much less, so a change is judged on
# both. The load's clients are proxy_load's (clients_open), either library.
from bench.proxy_load import CLIENTS, clients_open, cpu_seconds  # noqa: E402 - needs ROOT on the path


@dataclass
class Phase:
    """One timed phase of HTTP requests: wall time, each request's latency and status, and
    the CPU seconds the gunicorn processes and this process (the clients) spent on it."""

    expect: int
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    server_cpu: float = 0.0
    client_cpu: float = 0.0


async def http_phases(
    *,
    kind: str,
    base: str,
    headers: dict[str, str],
    clients: int,
    n: int,
    body: dict[str, Any],
    stamp: str,
    server_pid: int,
) -> dict[str, Phase]:
    """``n`` run submissions from ``clients`` concurrent keep-alive clients, then the floor: as
    many GET /healthz, the cheapest request there is, from the same clients right after. A
    warm-up first, not timed: every client's connection and the server threads it reaches
    (each with its database connection) set up, as in steady state."""

    async def submit(client: Any, i: int) -> int:
        request = {"json": body, "headers": {**headers, "Idempotency-Key": f"{stamp}-{i}"}}
        if kind == "aiohttp":
            async with client.post("/api/runs", **request) as resp:
                await resp.read()
                return resp.status
        return (await client.post("/api/runs", **request)).status_code

    async def health(client: Any, _: int) -> int:
        if kind == "aiohttp":
            async with client.get("/healthz") as resp:
                await resp.read()
                return resp.status
        return (await client.get("/healthz")).status_code

    async def run(pool: list[Any], phase: Phase, request: Any, numbers: range) -> None:
        queue = iter(numbers)

        async def one_client(client: Any) -> None:
            for i in queue:  # the clients share one iterator: each request is sent once
                t0 = time.perf_counter()
                phase.codes.append(await request(client, i))
                phase.latencies.append(time.perf_counter() - t0)

        server0, client0, t0 = cpu_seconds(server_pid), time.process_time(), time.perf_counter()
        await asyncio.gather(*(one_client(c) for c in pool))
        phase.elapsed = time.perf_counter() - t0
        phase.server_cpu, phase.client_cpu = cpu_seconds(server_pid) - server0, time.process_time() - client0

    async with contextlib.AsyncExitStack() as stack:
        pool = await clients_open(stack, kind=kind, base=base, n=clients, timeout=60)
        await run(pool, Phase(expect=201), submit, range(-clients * 4, 0))
        phases = {"submit": Phase(expect=201), "floor": Phase(expect=200)}
        await run(pool, phases["submit"], submit, range(n))
        await run(pool, phases["floor"], health, range(n))
    return phases


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
    parser.add_argument(
        "--client",
        choices=CLIENTS,
        default="httpx",
        help="the submitters' HTTP client, for the floor alike (httpx: the CLI's and the SDKs' own)",
    )
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
        figures: dict[str, Any] = {}

        phases = asyncio.run(
            http_phases(
                kind=args.client,
                base=base,
                headers=headers,
                clients=args.clients,
                n=args.submissions,
                body=body,
                stamp=stamp,
                server_pid=server.pid,
            )
        )
        for name, phase in phases.items():
            assert all(c == phase.expect for c in phase.codes), (name, set(phase.codes))
        submitted, floor = phases["submit"], phases["floor"]
        lat = sorted(submitted.latencies)
        figures["client"] = args.client
        figures["submissions_per_s"] = round(args.submissions / submitted.elapsed, 1)
        figures["gateway_cpu_ms_per_submission"] = round(submitted.server_cpu / args.submissions * 1000, 2)
        figures["client_cpu_ms_per_submission"] = round(submitted.client_cpu / args.submissions * 1000, 2)
        print(
            f"run submissions (HTTP, {args.clients} {args.client} clients, gunicorn 2x8): "
            f"{args.submissions / submitted.elapsed:,.0f} runs/s; latency p50 {statistics.median(lat) * 1000:.1f} ms, "
            f"p99 {lat[int(len(lat) * 0.99) - 1] * 1000:.1f} ms; CPU per run: the gateway's "
            f"{submitted.server_cpu / args.submissions * 1000:.2f} ms, the clients' "
            f"{submitted.client_cpu / args.submissions * 1000:.2f} ms"
        )
        figures["submission_floor_per_s"] = round(args.submissions / floor.elapsed, 1)
        figures["floor_cpu_ms_per_request"] = round(floor.server_cpu / args.submissions * 1000, 2)
        figures["floor_client_cpu_ms_per_request"] = round(floor.client_cpu / args.submissions * 1000, 2)
        print(
            f"the floor, GET /healthz (no authentication, SELECT 1) on the same server and clients: "
            f"{args.submissions / floor.elapsed:,.0f} requests/s; CPU per request: the gateway's "
            f"{floor.server_cpu / args.submissions * 1000:.2f} ms, the clients' "
            f"{floor.client_cpu / args.submissions * 1000:.2f} ms"
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
