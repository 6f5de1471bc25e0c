"""Trial throughput of one trials worker on this machine: 100 trivial tasks with the oracle
agent through real Celery workers, Harbor trials and the local bubblewrap sandbox.

    .venv/bin/python bench/trials_throughput.py [--tasks 100] [--slots 4]

Prints trials per minute, the sandbox start overhead (Harbor's environment-setup phase:
sandbox creation, cgroups, workdir copy) p50/p99, per-trial wall time p50/p99, and the
peak memory of the worker's process tree (sampled from /proc) against its memory
budget, and the slot use: the share of the slots' time (slots x the span from the first
start to the last finish) that trials held. Uses PostgreSQL (DATABASE_URL, default
database synth_bench) and Redis. The last line is one JSON object of the figures.

Side by side it prints the sandbox floor: the same number of bare sandboxes of the same
shape (limits, start, the agent's one command and the tests' one command, stop), run
``slots`` at a time with no Harbor, Django or database, and the CPU time the worker's process
tree spent per trial. On a small host these bound what any trial scheduling can reach.
PostgreSQL shares the host: its backends' CPU per trial (from /proc, as bench/proxy_load.py
reads it) and the bench database's committed transactions per trial are printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/synth_bench")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/13")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def make_tasks(root: Path, n: int) -> None:
    for i in range(n):
        d = root / f"trivial-{i:03d}"
        (d / "environment").mkdir(parents=True)
        (d / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
        (d / "task.toml").write_text(
            f'[task]\nname = "bench/trivial-{i:03d}"\n[agent]\ntimeout_sec = 60.0\n[verifier]\ntimeout_sec = 60.0\n'
            '[environment]\ncpus = 0.25\nmemory_mb = 256\nstorage_mb = 64\nworkdir = "/app"\n'
        )
        (d / "instruction.md").write_text(f"Write {i} to /app/out.txt\n")
        (d / "tests").mkdir()
        (d / "tests" / "test.sh").write_text(
            f'#!/bin/bash\n[ "$(cat /app/out.txt)" = "{i}" ] && echo 1 > /logs/verifier/reward.txt '
            "|| echo 0 > /logs/verifier/reward.txt\n"
        )
        (d / "solution").mkdir()
        (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho {i} > /app/out.txt\n")


def _tree_sum(pid: int, value: Callable[[list[str], Path], int]) -> int:
    """The sum of ``value(stat fields after the command name, /proc entry)`` over a process
    and all its descendants."""
    children: dict[int, list[int]] = {}
    values: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            ppid, own = int(fields[1]), value(fields, entry)
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
        values[int(entry.name)] = own
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += values.get(p, 0)
        stack.extend(children.get(p, []))
    return total


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants (from /proc), in MB."""
    pages = _tree_sum(pid, lambda _fields, entry: int((entry / "statm").read_text().split()[1]))
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def tree_cpu_s(pid: int) -> float:
    """CPU time (user + system) of a process and its descendants, with their reaped children."""
    # utime, stime, cutime, cstime
    ticks = _tree_sum(pid, lambda fields, _entry: sum(int(f) for f in fields[11:15]))
    return ticks / os.sysconf("SC_CLK_TCK")


def sandbox_floor(*, n: int, slots: int) -> dict[str, float]:
    """``n`` bare sandbox lifecycles shaped like a trivial trial's (its limits; start, the
    agent's command, the tests' command, stop), ``slots`` at a time: the rate the sandbox
    alone allows on this host, and its wall and CPU time per lifecycle."""
    import asyncio
    import resource

    from synth_sandbox.environment import default_sandbox_root
    from synth_sandbox.limits import SandboxLimits
    from synth_sandbox.sandbox import Sandbox

    root = default_sandbox_root()
    root.mkdir(parents=True, exist_ok=True)
    stamp = int(time.time())

    async def one(i: int, gate: asyncio.Semaphore, walls: list[float]) -> None:
        async with gate:
            started = time.monotonic()
            sandbox = Sandbox(
                name=f"floor-{stamp}-{i}",
                base_dir=root,
                limits=SandboxLimits(memory_mb=256, cpus=0.25, storage_mb=64),
            )
            await sandbox.start()
            try:
                await sandbox.exec(f"echo {i} > /app/out.txt")
                await sandbox.exec(f'[ "$(cat /app/out.txt)" = "{i}" ] && mkdir -p /logs/verifier')
            finally:
                await sandbox.stop()
            walls.append(time.monotonic() - started)

    async def run() -> list[float]:
        gate, walls = asyncio.Semaphore(slots), []
        await asyncio.gather(*(one(i, gate, walls) for i in range(n)))
        return walls

    def cpu() -> float:
        return sum(
            u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        )

    began, cpu0 = time.monotonic(), cpu()
    walls = asyncio.run(run())
    span, cpu_s = time.monotonic() - began, cpu() - cpu0
    return {
        "per_min": round(n / span * 60, 1),
        "wall_p50_s": round(statistics.median(walls), 3),
        "cpu_ms": round(cpu_s / n * 1000, 1),
    }


def database_counts(url: str) -> tuple[int, int]:
    """(transactions committed, sessions begun) in the bench database so far (pg_stat_database;
    this query's own session counts once it ends)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, sessions FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument(
        "--pool", type=int, default=0, help="the worker's pool processes (default: slots + 1, one trial waiting)"
    )
    parser.add_argument("--memory-mb", type=int, default=4096, help="the worker's memory budget")
    args = parser.parse_args()

    import logging

    import psycopg
    import redis

    url = os.environ["DATABASE_URL"]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        name = url.rsplit("/", 1)[1]
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    redis.Redis.from_url(os.environ["CELERY_BROKER_URL"]).flushdb()
    import django

    django.setup()
    logging.getLogger().setLevel(logging.WARNING)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from apps.accounts.services import membership_set, org_get_or_create
    from apps.datasets.services import dataset_import_dir
    from apps.profiles.services import profile_publish
    from apps.runs.models import Run, RunEvent, Trial
    from apps.runs.services import run_submit
    from bench.proxy_load import PostgresCpu

    stamp = str(int(time.time()))
    org = org_get_or_create(slug=f"bench-{stamp}")
    user = membership_set(org=org, username=f"bench-{stamp}").user
    with tempfile.TemporaryDirectory() as tmp:
        make_tasks(Path(tmp), args.tasks)
        dsv, _ = dataset_import_dir(org=org, name="trivial", version="1", path=Path(tmp))
    actor, _ = profile_publish(
        org=org,
        name="oracle",
        recipe={"engine": {"name": "oracle", "version": "1"}, "limits": {"timeout_sec": 60}},
        created_by=user,
    )
    env = dict(
        os.environ,
        SYNTH_WORKER_SLOTS=str(args.slots),
        SYNTH_WORKER_MEMORY_MB=str(args.memory_mb),
        SYNTH_WORKER_NAME=f"bench-{stamp}",
        # Persistent database connections, as the deployment's trials workers run
        # (deploy/k8s/workers.yaml): a trial's phases reuse one instead of connecting each.
        SYNTH_DB_CONN_MAX_AGE="60",
    )
    work = tempfile.mkdtemp(prefix="synth-bench-")
    env["SYNTH_WORK_DIR"] = work
    log = open(Path(work) / "worker.log", "wb")
    worker = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/celery"),
            "-A",
            "synth_project",
            "worker",
            "-Q",
            "control,trials",
            "-c",
            str(args.pool or args.slots + 1),
            "--without-gossip",
            "--without-mingle",
            "-l",
            "WARNING",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    peak = {"rss": 0.0}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            peak["rss"] = max(peak["rss"], tree_rss_mb(worker.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        time.sleep(3)  # the worker boots (imports Django, Harbor)
        idle_rss = tree_rss_mb(worker.pid)
        cpu_before = tree_cpu_s(worker.pid)
        # Sampled coarsely: its backends live as long as the run (persistent connections), and
        # a finer scan of /proc would take CPU from the worker it measures.
        pg_cpu = PostgresCpu(database=url.rsplit("/", 1)[1], interval=0.5)
        pg_cpu.start()
        counts_before = database_counts(url)
        run, _ = run_submit(
            org=org,
            user=user,
            idempotency_key=stamp,
            body={
                "kind": "evaluate",
                "dataset": dsv.reference,
                "actor": {"profile": "oracle", "version": actor.version},
                "plan": {"attempts_per_task": 1, "max_concurrency": args.slots * 2},
            },
        )
        deadline = time.monotonic() + 1800
        while not Run.objects.get(pk=run.id).is_terminal and time.monotonic() < deadline:
            time.sleep(0.5)
        run.refresh_from_db()
        worker_cpu = tree_cpu_s(worker.pid) - cpu_before
        pg_database_cpu, pg_server_cpu = pg_cpu.stop()
        counts = database_counts(url)
        commits, sessions = counts[0] - counts_before[0], counts[1] - counts_before[1] - 1
    finally:
        done.set()
        os.killpg(worker.pid, 15)
        worker.wait(timeout=60)

    floor = sandbox_floor(n=args.tasks, slots=args.slots)
    trials = list(Trial.objects.filter(run=run))
    starts = [t.started_at for t in trials if t.started_at]
    ends = [t.finished_at for t in trials if t.finished_at]
    span = (max(ends) - min(starts)).total_seconds()
    setup = [
        t.timings["environment_setup"]["seconds"]
        for t in trials
        if (t.timings or {}).get("environment_setup") and "seconds" in t.timings["environment_setup"]
    ]
    walls = [(t.finished_at - t.started_at).total_seconds() for t in trials if t.started_at and t.finished_at]
    # Every trial that waited has its grant's event (a long wait is announced too).
    waits = RunEvent.objects.filter(run=run, type="admission.granted").count()
    reserved_peak = max(
        (e.data["usage"]["memory_mb"] for e in RunEvent.objects.filter(run=run, type__startswith="admission.")),
        default=0,
    )
    print(
        f"run {run.id}: {run.status}, {len(trials)} trials, mean reward {run.summary.get('mean_reward')}, "
        f"errors {run.summary.get('errors')}"
    )
    print(
        f"throughput: {len(trials) / span * 60:,.1f} trials/min with {args.slots} slots on {os.cpu_count()} cores "
        f"({span:.1f} s from first start to last finish)"
    )
    print(
        f"sandbox start overhead (environment setup): p50 {statistics.median(setup) * 1000:.0f} ms, "
        f"p99 {pct(setup, 0.99) * 1000:.0f} ms"
    )
    print(f"trial wall time (start to settled): p50 {statistics.median(walls):.2f} s, p99 {pct(walls, 0.99):.2f} s")
    print(
        f"memory: worker tree peak RSS {peak['rss']:.0f} MB (idle {idle_rss:.0f} MB) against a budget of "
        f"{args.memory_mb} MB; peak reserved by admission {reserved_peak} MB; {waits} admission waits"
    )
    # A trial holds its slot from its start (admitted) to its end; the slots' time is the span.
    slot_use = sum(walls) / (args.slots * span) if span > 0 else 0.0
    print(f"slot use: {slot_use:.1%} of {args.slots} slots x {span:.1f} s")
    cpu_per_trial = worker_cpu / max(1, len(trials))
    print(
        f"worker CPU: {cpu_per_trial * 1000:.0f} ms per trial (its process tree: Harbor, Django, the sandboxes); "
        f"{os.cpu_count()} cores allow at most {60 * (os.cpu_count() or 1) / cpu_per_trial:,.0f} trials/min of it"
    )
    n = max(1, len(trials))
    print(
        f"PostgreSQL: {pg_server_cpu * 1000 / n:.0f} ms CPU per trial (every process of the server, exited "
        f"backends included; {pg_database_cpu * 1000 / n:.0f} ms in the bench database's backends sampled alive); "
        f"{commits / n:.1f} committed transactions and {sessions / n:.2f} new connections per trial "
        "(this process' polls included)"
    )
    print(
        f"sandbox floor: {args.tasks} bare sandboxes of the same shape (start, 2 commands, stop), "
        f"{args.slots} at a time: {floor['per_min']:,.1f}/min, p50 {floor['wall_p50_s']:.2f} s, "
        f"{floor['cpu_ms']:.0f} ms CPU each"
    )
    figures = {
        "trials": len(trials),
        "slots": args.slots,
        "trials_per_min": round(len(trials) / span * 60, 1),
        "slot_use": round(slot_use, 3),
        "trial_wall_p50_s": round(statistics.median(walls), 3),
        "sandbox_setup_p50_ms": round(statistics.median(setup) * 1000),
        "admission_waits": waits,
        "worker_cpu_ms_per_trial": round(cpu_per_trial * 1000),
        "pg_cpu_ms_per_trial": round(pg_server_cpu * 1000 / n),
        "commits_per_trial": round(commits / n, 1),
        "connections_per_trial": round(sessions / n, 2),
        "sandbox_floor_per_min": floor["per_min"],
        "sandbox_floor_wall_p50_s": floor["wall_p50_s"],
        "sandbox_floor_cpu_ms": floor["cpu_ms"],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
