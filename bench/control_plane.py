"""Control-plane throughput on PostgreSQL: run submissions per second (through the HTTP
API served by gunicorn, several concurrent clients) and event append / read rates.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/synth_bench .venv/bin/python bench/control_plane.py

Prints figures; asserts nothing. The database named in DATABASE_URL is created if
missing and its tables are migrated; rows are left behind for inspection.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=400)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--events", type=int, default=5000)
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
    from apps.runs.services import event_append
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

        local = threading.local()

        def submit(i: int) -> int:
            # One keep-alive client per thread: the figure is the server's, not TCP set-up's.
            if not hasattr(local, "client"):
                local.client = httpx.Client(base_url=base, headers=headers, timeout=60)
            t0 = time.perf_counter()
            resp = local.client.post("/api/runs", json=body, headers={"Idempotency-Key": f"{stamp}-{i}"})
            latencies.append(time.perf_counter() - t0)
            return resp.status_code

        submit(-1)  # warm up
        latencies.clear()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            codes = list(pool.map(submit, range(args.submissions)))
        elapsed = time.perf_counter() - t0
        assert all(c == 201 for c in codes), set(codes)
        lat = sorted(latencies)
        print(
            f"run submissions (HTTP, {args.clients} clients, gunicorn 2x8): "
            f"{args.submissions / elapsed:,.0f} runs/s; latency p50 {statistics.median(lat) * 1000:.1f} ms, "
            f"p99 {lat[int(len(lat) * 0.99) - 1] * 1000:.1f} ms"
        )

        run = Run.objects.filter(org=org).first()
        t0 = time.perf_counter()
        for i in range(args.events):
            with transaction.atomic():
                event_append(run_id=run.id, type="progress.tick", data={"i": i})
        elapsed = time.perf_counter() - t0
        print(f"event append (one per transaction, one run): {args.events / elapsed:,.0f} events/s")

        def append_many(run_id: str, n: int) -> None:
            from django.db import connections

            try:
                for i in range(n):
                    with transaction.atomic():
                        event_append(run_id=run_id, type="progress.tick", data={"i": i})
            finally:
                connections.close_all()

        runs = list(Run.objects.filter(org=org).values_list("id", flat=True)[:8])
        per = args.events // len(runs)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(runs)) as pool:
            list(pool.map(lambda r: append_many(r, per), runs))
        elapsed = time.perf_counter() - t0
        print(f"event append ({len(runs)} runs in parallel threads): {per * len(runs) / elapsed:,.0f} events/s")

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
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
