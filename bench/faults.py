"""Faults, end to end: does every accepted run still finish?

    .venv/bin/python bench/faults.py [--scenarios NAME,...] [--quick] [--keep]

Each scenario runs real processes (Celery workers; the model proxy and the gateway where it
needs them) against a PRIVATE PostgreSQL and a PRIVATE Redis that this script starts itself
on free ports in a temporary directory (initdb + pg_ctl; redis-server without persistence),
migrates, imports examples/tasks into, and removes afterwards. The machine's own services
are never touched. Leases last SYNTH_LEASE_TTL_SECONDS=5; the reaper/sweeper runs every
second. The scenarios:

  trials-kill       SIGKILL of the trials worker's whole process group mid-trial; it starts again
  child-kill        SIGKILL of one pool child mid-trial while its sibling runs on
  training-kill     SIGKILL of the training worker during a learning update (local backend, tiny model)
  redis-restart     Redis restarted, without persistence, while trials are queued and running
  postgres-restart  `pg_ctl restart -m fast` while trials run, twice (mid-attempt, and as they end)
  gateway-restart   the gateway (gunicorn) killed and started again under a client that submits
                    (one run before, one during the outage) and polls through it
  second-host       a trials worker host dies; another host (its own SYNTH_WORKER_NAME) takes over

Prints one line per scenario, then, last, one JSON object: scenarios, runs_finished (a run
that succeeded with every trial succeeded; for training-kill, one that ended, failed or
blocked with its message), trials_counted_twice, reservations_leaked (still open after the
run ended), sandboxes_left (sandbox and work directories, tmpfs mounts and cgroups left
after the run ended), results_lost (attempts whose verifier gave a reward, as the worker
logged it, under a lease that never completed), max_recovery_s (from the fault to the first
sign of progress of the work it hit: an event about an affected trial or a heartbeat of its
lease; for training, the run's next event; for the gateway, the client's next answer), and
per_scenario. --quick runs postgres-restart and child-kill with fewer trials (the test suite
runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"
LEASE_TTL = 5
SCENARIOS = (
    "trials-kill",
    "child-kill",
    "training-kill",
    "redis-restart",
    "postgres-restart",
    "gateway-restart",
    "second-host",
)
QUICK = ("postgres-restart", "child-kill")
TOKENIZER_DIR = "/tmp/synth-test-tokenizers"  # a cache shared with the test suite (built offline)
RESULT_LINE = re.compile(
    r"trial (?P<trial>trl_\w+): attempt under lease (?P<lease>lse_\w+) \(fence (?P<fence>\d+)\) "
    r"ended (?P<status>\w+), rewards (?P<rewards>.+?); recording it"
)


def log(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


# --------------------------------------------------------------------------- private services


def _as_postgres(cmd: list[str]) -> list[str]:
    # initdb and the server refuse to run as root.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class PrivatePostgres:
    """A throwaway PostgreSQL cluster on a free port, in its own directory."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.data = base / "data"
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/synth"

    def _ctl(self, *args: str, check: bool = True) -> None:
        options = (
            f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c max_connections=200 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        cmd = ["pg_ctl", "-D", str(self.data), "-l", str(self.base / "postgres.log"), "-o", options, "-w", *args]
        subprocess.run(_as_postgres(cmd), check=check, stdout=subprocess.DEVNULL)

    def start(self) -> None:
        import psycopg

        self.base.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
        initdb = ["initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"]
        subprocess.run(_as_postgres(initdb), check=True, stdout=subprocess.DEVNULL)
        self._ctl("start")
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE synth")

    def restart(self) -> None:
        self._ctl("restart", "-m", "fast")

    def stop(self) -> None:
        if self.data.exists():
            self._ctl("stop", "-m", "immediate", check=False)


class PrivateRedis:
    """A throwaway Redis on a free port that keeps nothing on disk: a restart loses every message."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.base.mkdir(parents=True, exist_ok=True)
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        with open(self.base / "redis.log", "ab") as out:
            self.proc = subprocess.Popen([*cmd, "--dir", str(self.base)], stdout=out, stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url)

        def up() -> bool:
            with contextlib.suppress(redis.ConnectionError):
                return bool(client.ping())
            return False

        wait_until(up, timeout=20, what="the private Redis")

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


# --------------------------------------------------------------------------- platform processes


@dataclass
class Host:
    """A trials worker host: its node name and its own sandbox root and work directory."""

    name: str
    tmp: Path  # TMPDIR: the sandbox root is TMPDIR/synth-sandboxes
    work: Path

    @property
    def sandbox_root(self) -> Path:
        return self.tmp / "synth-sandboxes"

    def env(self) -> dict[str, str]:
        return {"SYNTH_WORKER_NAME": self.name, "TMPDIR": str(self.tmp), "SYNTH_WORK_DIR": str(self.work)}


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class Cluster:
    """The platform's processes on the private services; every one in its own process group."""

    def __init__(self, *, base: Path, env: dict[str, str]) -> None:
        self.base = base
        self.env = env
        self.procs: list[Proc] = []
        self.spawned = 0
        self.logs = base / "logs"
        self.logs.mkdir(exist_ok=True)
        self.gateway_port = int(env["SYNTH_PUBLIC_URL"].rsplit(":", 1)[1])

    def _spawn(self, name: str, cmd: list[str], extra: dict[str, str] | None = None) -> Proc:
        self.spawned += 1
        path = self.logs / f"{self.spawned:02d}-{name}.log"
        with open(path, "wb") as out:
            popen = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env={**self.env, **(extra or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name=name, popen=popen, log=path)
        self.procs.append(proc)
        return proc

    def worker(self, name: str, *, queues: str, concurrency: int, host: Host | None = None, beat: bool = False) -> Proc:
        cmd = [str(BIN / "celery"), "-A", "synth_project", "worker", "-Q", queues, "-c", str(concurrency)]
        cmd += ["-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"]
        if beat:
            cmd += ["-B", "-s", str(self.base / f"beat-{uuid.uuid4().hex[:6]}")]
        proc = self._spawn(name, cmd, host.env() if host else None)
        wait_until(lambda: " ready." in proc.text() or proc.popen.poll() is not None, timeout=120, what=name)
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{name} exited at start:\n{proc.text()[-3000:]}")
        return proc

    def proxy(self) -> Proc:
        from apps.trials.model_access import proxy_listening

        socket_path = Path(self.env["SYNTH_PROXY_SOCKET"])
        socket_path.unlink(missing_ok=True)
        cmd = [str(BIN / "uvicorn"), "synth_project.asgi:application", "--uds", str(socket_path), "--lifespan", "off"]
        proc = self._spawn("proxy", cmd)
        wait_until(lambda: proxy_listening(path=socket_path), timeout=90, what="the model proxy")
        return proc

    def gateway(self) -> Proc:
        import httpx

        cmd = [str(BIN / "gunicorn"), "synth_project.wsgi", "-c", str(ROOT / "deploy/gunicorn.conf.py")]
        proc = self._spawn("gateway", [*cmd, "-b", f"127.0.0.1:{self.gateway_port}", "-w", "1"])

        def up() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"http://127.0.0.1:{self.gateway_port}/healthz", timeout=2).status_code == 200
            return False

        wait_until(up, timeout=90, what="the gateway")
        return proc

    def kill(self, proc: Proc) -> None:
        """SIGKILL of the whole process group (the worker and its pool; gunicorn and its workers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait(timeout=30)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill(proc)
            # The whole group: a pool child that outlived its parent must not linger.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGKILL)
        self.procs = []

    def trial_logs(self) -> str:
        return "\n".join(p.text() for p in self.procs if p.name.startswith("trials"))


# --------------------------------------------------------------------------- inputs


def make_sleep_task(root: Path, *, seconds: int) -> Path:
    """A task the oracle solves after ``seconds`` of work: faults land mid-attempt."""
    d = root / f"sleep-{seconds}"
    (d / "environment").mkdir(parents=True)
    (d / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    (d / "task.toml").write_text(
        f'[task]\nname = "faults/sleep-{seconds}"\n[agent]\ntimeout_sec = 120.0\n[verifier]\ntimeout_sec = 60.0\n'
        '[environment]\ncpus = 0.25\nmemory_mb = 256\nstorage_mb = 64\nworkdir = "/app"\n'
    )
    (d / "instruction.md").write_text(f"Work for {seconds} seconds, then write done to /app/out.txt\n")
    (d / "tests").mkdir()
    (d / "tests" / "test.sh").write_text(
        '#!/bin/bash\n[ "$(cat /app/out.txt)" = done ] && echo 1 > /logs/verifier/reward.txt '
        "|| echo 0 > /logs/verifier/reward.txt\n"
    )
    (d / "solution").mkdir()
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\nsleep {seconds}\necho done > /app/out.txt\n")
    return d


@dataclass
class Inputs:
    org: Any
    user: Any
    examples: Any
    sleeps: Any
    oracle: dict[str, Any]
    token: str = ""
    train: Any = None
    train_actor: dict[str, Any] | None = None


def inputs_make(*, base: Path, training: bool) -> Inputs:
    from django.core.management import call_command

    from apps.accounts.services import membership_set, org_get_or_create, token_issue
    from apps.datasets.services import dataset_import_dir
    from apps.profiles.services import profile_publish

    call_command("migrate", verbosity=0)
    org = org_get_or_create(slug="faults")
    user = membership_set(org=org, username="operator").user
    examples, _ = dataset_import_dir(org=org, name="examples", version="1", path=ROOT / "examples" / "tasks")
    root = base / "tasks"
    for seconds in (3, 6, 10):
        make_sleep_task(root, seconds=seconds)
    sleeps, _ = dataset_import_dir(org=org, name="sleeps", version="1", path=root)
    recipe = json.loads((ROOT / "examples" / "oracle-agent.json").read_text())
    oracle, _ = profile_publish(org=org, name="oracle", recipe=recipe, created_by=user)
    out = Inputs(
        org=org,
        user=user,
        examples=examples,
        sleeps=sleeps,
        oracle={"profile": "oracle", "version": oracle.version},
        token=token_issue(org=org, user=user, name="faults").secret,
    )
    if training:
        from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
        from apps.proxy.tokenizers import provision

        provision(["qwen3"], root=Path(os.environ["SYNTH_TOKENIZER_DIR"]))
        route_upsert(**DEFAULT_ROUTE)
        out.train, _ = dataset_import_dir(org=org, name="toys", version="1", path=ROOT / "examples" / "train-tasks")
        recipe = json.loads((ROOT / "examples" / "train-agent.json").read_text())
        actor, _ = profile_publish(org=org, name="train-agent", recipe=recipe, created_by=user)
        out.train_actor = {"profile": "train-agent", "version": actor.version}
    return out


def run_submit_as(inputs: Inputs, *, dataset: Any, plan: dict[str, Any], kind: str = "evaluate", actor=None) -> str:
    from apps.runs.services import run_submit

    body = {"kind": kind, "dataset": dataset.reference, "actor": actor or inputs.oracle, "plan": plan}
    run, _ = run_submit(org=inputs.org, user=inputs.user, idempotency_key=uuid.uuid4().hex, body=body)
    return run.id


def sleep_plan(*, seconds: int, attempts: int, concurrency: int | None = None) -> dict[str, Any]:
    return {
        "task_names": [f"faults/sleep-{seconds}"],
        "attempts_per_task": attempts,
        "max_concurrency": concurrency or attempts,
        "on_lost": "retry",
        "max_retries": 3,
    }


# --------------------------------------------------------------------------- observation


def db(fn: Callable[[], Any]) -> Any:
    """A read of the bench itself, through a database that may be restarting."""
    from django.db import InterfaceError, OperationalError, close_old_connections
    from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

    retrying = Retrying(
        retry=retry_if_exception_type((OperationalError, InterfaceError)),
        wait=wait_fixed(0.2),
        stop=stop_after_delay(60),
        before_sleep=lambda _: close_old_connections(),
        reraise=True,
    )
    return retrying(fn)


def now() -> datetime:
    from django.utils import timezone

    return timezone.now()


def run_get(run_id: str) -> Any:
    from apps.runs.models import Run

    return db(lambda: Run.objects.get(pk=run_id))


def run_wait(run_id: str, *, timeout: float) -> Any:
    return wait_until(
        lambda: (r := run_get(run_id)).is_terminal and r, timeout=timeout, what=f"run {run_id}", interval=0.5
    )


def trials_of(run_id: str, **filters: Any) -> list[Any]:
    from apps.runs.models import Trial

    return db(lambda: list(Trial.objects.filter(run_id=run_id, **filters).order_by("id")))


def running(run_id: str, *, count: int, for_s: float = 1.0) -> list[Any]:
    """Wait until ``count`` trials have been running for ``for_s`` seconds."""

    def ready() -> list[Any]:
        trials = trials_of(run_id, status="running")
        old = [t for t in trials if t.started_at and (now() - t.started_at).total_seconds() >= for_s]
        return old if len(old) >= count else []

    return wait_until(ready, timeout=120, what=f"{count} running trials of {run_id}")


class Watch(threading.Thread):
    """Samples, while a scenario runs: the sandboxes on each host (their cgroups, to check
    later that none is left) and the first heartbeat after the fault of affected trials."""

    def __init__(self, *, hosts: list[Host]) -> None:
        super().__init__(daemon=True)
        self.hosts = hosts
        self.cgroups: set[str] = set()
        self.fault_end: datetime | None = None
        self.affected: list[str] = []
        self.heartbeats: dict[str, datetime] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        from django.db import connections

        try:
            while not self._halt.wait(0.2):
                self._sample()
        finally:
            connections.close_all()

    def _sample(self) -> None:
        for host in self.hosts:
            for meta in host.sandbox_root.glob("*/meta.json"):
                with contextlib.suppress(OSError, ValueError):
                    self.cgroups.update(json.loads(meta.read_text()).get("cgroups") or [])
        if self.fault_end is None or not self.affected:
            return
        from django.db import DatabaseError, close_old_connections

        from apps.runs.models import Lease

        units = {f"trial:{t}": t for t in self.affected if t not in self.heartbeats}
        try:
            beats = Lease.objects.filter(unit__in=units, heartbeat_at__gt=self.fault_end).values_list(
                "unit", "heartbeat_at"
            )
            for unit, at in beats:
                self.heartbeats.setdefault(units[unit], at)
        except DatabaseError:
            close_old_connections()

    def fault(self, *, affected: list[str]) -> None:
        """The fault is over (the kill or restart returned): heartbeats from now on count."""
        self.affected = affected
        self.fault_end = now()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


@dataclass
class Result:
    name: str
    finished: bool
    detail: str
    recovery_s: float | None
    counted_twice: int = 0
    reservations_leaked: int = 0
    sandboxes_left: int = 0
    results_lost: int = 0
    notes: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        recovery = f"{self.recovery_s:.1f} s" if self.recovery_s is not None else "none"
        notes = "".join(f"; {k} {v}" for k, v in self.notes.items())
        return (
            f"{self.name}: {'finished' if self.finished else 'NOT FINISHED'} ({self.detail}); recovery {recovery}; "
            f"counted twice {self.counted_twice}; reservations leaked {self.reservations_leaked}; "
            f"sandboxes left {self.sandboxes_left}; results lost {self.results_lost}{notes}"
        )


def recovery(*, run_id: str, fault: datetime, affected: list[str], watch: Watch | None = None) -> float | None:
    """Seconds from the fault to the first sign of progress of each affected trial (an
    event about it, a heartbeat of its lease), the slowest of them; the run's next event
    when no trial is named."""
    from apps.runs.models import RunEvent

    events = db(
        lambda: list(RunEvent.objects.filter(run_id=run_id, created_at__gt=fault).values_list("created_at", "data"))
    )
    if not affected:
        return (min(at for at, _ in events) - fault).total_seconds() if events else None
    worst = 0.0
    for trial in affected:
        signs = [at for at, data in events if data.get("trial") == trial or data.get("unit") == f"trial:{trial}"]
        if watch is not None and trial in watch.heartbeats:
            signs.append(watch.heartbeats[trial])
        if not signs:
            return None
        worst = max(worst, (min(signs) - fault).total_seconds())
    return worst


def counted_twice(run_ids: list[str]) -> int:
    from apps.runs.models import RunEvent

    finished = db(
        lambda: list(
            RunEvent.objects.filter(run_id__in=run_ids, type="trial.finished").values_list("data__trial", flat=True)
        )
    )
    return sum(1 for n in Counter(finished).values() if n > 1)


def reservations_open(run_ids: list[str]) -> int:
    from apps.runs.models import Reservation

    return db(lambda: Reservation.objects.filter(trial__run_id__in=run_ids, status__in=["waiting", "held"]).count())


def leftovers(*, hosts: list[Host], watch: Watch) -> list[str]:
    """What trials left on the hosts: sandbox and work directories, tmpfs mounts, cgroups."""
    found = []
    for host in hosts:
        found += [f"sandbox {p.name}" for p in host.sandbox_root.glob("*") if p.is_dir()]
        found += [f"work dir {p.name}" for p in host.work.glob("*") if p.is_dir()]
        with open("/proc/self/mountinfo") as mounts:
            found += [f"mount {line.split()[4]}" for line in mounts if line.split()[4].startswith(str(host.tmp))]
    found += [f"cgroup {c}" for c in watch.cgroups if Path(c).exists()]
    return found


def results_lost(logs: str) -> int:
    """Attempts the worker said ended with rewards whose lease never completed."""
    from apps.runs.models import Lease

    lost = 0
    for match in RESULT_LINE.finditer(logs):
        if match["rewards"] == "None":
            continue
        status = db(lambda m=match: Lease.objects.filter(pk=m["lease"]).values_list("status", flat=True).first())
        lost += status != "completed"
    return lost


def tally(
    *,
    name: str,
    cluster: Cluster,
    run_ids: list[str],
    hosts: list[Host],
    watch: Watch,
    recovery_s: float | None,
    training: bool = False,
    notes: dict[str, Any] | None = None,
) -> Result:
    runs = [run_get(r) for r in run_ids]
    statuses = Counter(t.status for r in run_ids for t in trials_of(r))
    if training:
        finished = all(r.is_terminal and (r.status == "succeeded" or r.error) for r in runs)
    else:
        finished = all(r.status == "succeeded" for r in runs) and set(statuses) == {"succeeded"}
    detail = ", ".join(f"{r.id} {r.status}" + (f": {r.error[:120]}" if r.error else "") for r in runs)
    detail += f"; trials {dict(statuses)}"
    errors = Counter(f"{t.error_type}: {t.error_message[:160]}" for r in run_ids for t in trials_of(r) if t.error_type)
    if errors:
        detail += f"; errors {dict(errors.most_common(2))}"
    # The workers' own clean-up (a finally, the reaper) may take a lease TTL or two.
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: not reservations_open(run_ids), timeout=2 * LEASE_TTL + 2, what="reservations")
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: not leftovers(hosts=hosts, watch=watch), timeout=LEASE_TTL, what="leftovers")
    left = leftovers(hosts=hosts, watch=watch)
    if left:
        log(f"{name}: left behind: {', '.join(left[:8])}")
    return Result(
        name=name,
        finished=finished,
        detail=detail,
        recovery_s=recovery_s,
        counted_twice=counted_twice(run_ids),
        reservations_leaked=reservations_open(run_ids),
        sandboxes_left=len(left),
        results_lost=results_lost(cluster.trial_logs()),
        notes=notes or {},
    )


# --------------------------------------------------------------------------- scenarios


@dataclass
class Bench:
    base: Path
    pg: PrivatePostgres
    redis: PrivateRedis
    cluster: Cluster
    inputs: Inputs
    quick: bool
    host_a: Host
    host_b: Host

    def control(self) -> Proc:
        return self.cluster.worker("control", queues="control,evidence", concurrency=2, beat=True)

    def trials(self, *, host: Host | None = None, concurrency: int = 2, tag: str = "a") -> Proc:
        return self.cluster.worker(f"trials-{tag}", queues="trials", concurrency=concurrency, host=host or self.host_a)


def scenario_trials_kill(b: Bench) -> Result:
    b.control()
    worker = b.trials()
    run_id = run_submit_as(b.inputs, dataset=b.inputs.sleeps, plan=sleep_plan(seconds=6, attempts=3))
    watch = Watch(hosts=[b.host_a])
    watch.start()
    affected = [t.id for t in running(run_id, count=2)]
    fault = now()
    b.cluster.kill(worker)
    watch.fault(affected=affected)
    log(f"trials-kill: killed the trials worker holding {affected}")
    b.trials()
    run_wait(run_id, timeout=180)
    watch.stop()
    rec = recovery(run_id=run_id, fault=fault, affected=affected, watch=watch)
    return tally(name="trials-kill", cluster=b.cluster, run_ids=[run_id], hosts=[b.host_a], watch=watch, recovery_s=rec)


def _sandbox_owners(host: Host) -> dict[int, str]:
    """Live sandboxes on the host, by owner pid -> sandbox name."""
    owners = {}
    for meta in host.sandbox_root.glob("*/meta.json"):
        with contextlib.suppress(OSError, ValueError):
            owners[int(json.loads(meta.read_text())["owner_pid"])] = meta.parent.name
    return owners


def _work_owners(host: Host) -> dict[int, str]:
    owners = {}
    for owner in host.work.glob("*/owner.json"):
        with contextlib.suppress(OSError, ValueError):
            owners[int(json.loads(owner.read_text())["owner_pid"])] = owner.parent.name
    return owners


def scenario_child_kill(b: Bench) -> Result:
    b.control()
    b.trials(concurrency=2)
    seconds = 10
    run_id = run_submit_as(b.inputs, dataset=b.inputs.sleeps, plan=sleep_plan(seconds=seconds, attempts=2))
    watch = Watch(hosts=[b.host_a])
    watch.start()
    running(run_id, count=2)
    owners = wait_until(
        lambda: (o := _sandbox_owners(b.host_a)) and len(o) == 2 and o, timeout=30, what="two sandboxes"
    )
    works = _work_owners(b.host_a)
    victim, sibling = sorted(owners)
    victim_trial = works[victim].split(".")[0]
    fault = now()
    os.kill(victim, signal.SIGKILL)
    watch.fault(affected=[victim_trial])
    log(f"child-kill: killed pool child {victim} running {victim_trial}; sibling {sibling} runs on")

    def reaped() -> bool:
        return not (b.host_a.sandbox_root / owners[victim]).exists() and not (b.host_a.work / works[victim]).exists()

    t0 = time.monotonic()
    try:
        wait_until(reaped, timeout=2 * LEASE_TTL, what="the killed child's sandbox and work dir to go")
        reaped_s: float | None = round(time.monotonic() - t0, 1)
    except TimeoutError:
        reaped_s = None
    # The sibling's attempt was still mid-sleep: its sandbox must have survived the reaping.
    sibling_kept = (b.host_a.sandbox_root / owners[sibling]).exists()
    run_wait(run_id, timeout=180)
    watch.stop()
    sibling_trial = works.get(sibling, "").split(".")[0]
    sibling_row = next((t for t in trials_of(run_id) if t.id == sibling_trial), None)
    sibling_ok = (
        sibling_kept and sibling_row is not None and sibling_row.status == "succeeded" and sibling_row.tries == 1
    )
    rec = recovery(run_id=run_id, fault=fault, affected=[victim_trial], watch=watch)
    result = tally(
        name="child-kill",
        cluster=b.cluster,
        run_ids=[run_id],
        hosts=[b.host_a],
        watch=watch,
        recovery_s=rec,
        notes={"reaped_without_restart_s": reaped_s, "sibling_untouched": sibling_ok},
    )
    result.finished = result.finished and reaped_s is not None and sibling_ok
    return result


TRAIN_PLAN = {
    "backend": "local",
    "batch_size": 2,
    "group_size": 3,
    "steps": 2,
    "learning_rate": 0.02,
    "lora_rank": 4,
    "save_every": 1,
    "max_concurrency": 6,
}


def scenario_training_kill(b: Bench) -> Result:
    from apps.training.models import LearningUpdate

    b.cluster.proxy()
    b.control()
    b.trials(concurrency=3)
    training = b.cluster.worker("training", queues="training", concurrency=1)
    run_id = run_submit_as(b.inputs, dataset=b.inputs.train, plan=TRAIN_PLAN, kind="train", actor=b.inputs.train_actor)
    watch = Watch(hosts=[b.host_a])
    watch.start()

    def updating() -> bool:
        # The update's row exists once the training worker runs it (gathering, then the step).
        updates = LearningUpdate.objects.filter(run_id=run_id, status__in=["pending", "unresolved"])
        return db(updates.exists)

    wait_until(updating, timeout=240, what="a learning update", interval=0.05)
    fault = now()
    b.cluster.kill(training)
    watch.fault(affected=[])
    log("training-kill: killed the training worker during an update")
    b.cluster.worker("training", queues="training", concurrency=1)
    try:
        run_wait(run_id, timeout=120)
    except TimeoutError as exc:
        log(f"training-kill: {exc}")
    watch.stop()
    rec = recovery(run_id=run_id, fault=fault, affected=[])
    return tally(
        name="training-kill",
        cluster=b.cluster,
        run_ids=[run_id],
        hosts=[b.host_a],
        watch=watch,
        recovery_s=rec,
        training=True,
    )


def scenario_redis_restart(b: Bench) -> Result:
    b.control()
    b.trials(concurrency=2)
    run_id = run_submit_as(b.inputs, dataset=b.inputs.sleeps, plan=sleep_plan(seconds=3, attempts=6))
    watch = Watch(hosts=[b.host_a])
    watch.start()
    running(run_id, count=2, for_s=0.5)
    # Handed to the queue but not claimed yet: their messages live only in Redis.
    queued = [t.id for t in trials_of(run_id, status="pending", queued_at__isnull=False)]
    fault = now()
    b.redis.restart()
    watch.fault(affected=queued)
    log(f"redis-restart: restarted Redis with {len(queued)} trial messages queued")
    try:
        run_wait(run_id, timeout=90)
    except TimeoutError as exc:
        log(f"redis-restart: {exc}")
    watch.stop()
    rec = recovery(run_id=run_id, fault=fault, affected=queued, watch=watch)
    return tally(
        name="redis-restart",
        cluster=b.cluster,
        run_ids=[run_id],
        hosts=[b.host_a],
        watch=watch,
        recovery_s=rec,
        notes={"messages_lost": len(queued)},
    )


def scenario_postgres_restart(b: Bench) -> Result:
    b.control()
    b.trials(concurrency=2)
    seconds = 6
    attempts = 2 if b.quick else 4
    run_id = run_submit_as(b.inputs, dataset=b.inputs.sleeps, plan=sleep_plan(seconds=seconds, attempts=attempts))
    watch = Watch(hosts=[b.host_a])
    watch.start()
    hit = running(run_id, count=2, for_s=1.5)
    affected = [t.id for t in hit]
    fault = now()
    b.pg.restart()  # mid-attempt: every worker's connection dies under it
    watch.fault(affected=affected)
    log(f"postgres-restart: restarted PostgreSQL while {affected} ran")
    if not b.quick:
        # Again about when those attempts end (sandbox, {seconds} s of work, verifier): their
        # results are being written, and the next trials are being claimed.
        ends = min(t.started_at for t in hit).timestamp() + seconds + 1.5
        time.sleep(max(0.0, ends - now().timestamp()))
        b.pg.restart()
        log("postgres-restart: restarted PostgreSQL again as attempts ended")
    run_wait(run_id, timeout=180)
    watch.stop()
    rec = recovery(run_id=run_id, fault=fault, affected=affected, watch=watch)
    reruns = sum(1 for t in trials_of(run_id) if t.tries > 1)
    return tally(
        name="postgres-restart",
        cluster=b.cluster,
        run_ids=[run_id],
        hosts=[b.host_a],
        watch=watch,
        recovery_s=rec,
        notes={"trials_run_twice": reruns},
    )


class Client:
    """An operator's client of the gateway: it retries through an outage (same
    Idempotency-Key for a submission) and notes when the gateway answers again."""

    def __init__(self, *, url: str, token: str) -> None:
        import httpx

        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        self.errors = 0
        self.last_error_at: float | None = None
        self.first_answer_after: dict[float, float] = {}

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        deadline = time.monotonic() + 120
        while True:
            try:
                resp = self.http.request(method, path, **kwargs)
            except httpx.TransportError:
                self.errors += 1
                self.last_error_at = time.monotonic()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
                continue
            if resp.status_code >= 500:
                raise RuntimeError(f"{method} {path}: {resp.status_code} {resp.text[:300]}")
            return resp

    def submit(self, body: dict[str, Any]) -> str:
        resp = self.call("POST", "/api/runs", json=body, headers={"Idempotency-Key": uuid.uuid4().hex})
        if resp.status_code not in (200, 201):
            raise RuntimeError(f"submission refused: {resp.status_code} {resp.text[:300]}")
        return resp.json()["id"]

    def poll(self, run_id: str, *, timeout: float) -> dict[str, Any]:
        terminal = {"succeeded", "failed", "cancelled"}
        return wait_until(
            lambda: (r := self.call("GET", f"/api/runs/{run_id}").json())["status"] in terminal and r,
            timeout=timeout,
            what=f"run {run_id} through the gateway",
            interval=0.5,
        )


def scenario_gateway_restart(b: Bench) -> Result:
    gateway = b.cluster.gateway()
    b.control()
    b.trials(concurrency=2)
    client = Client(url=f"http://127.0.0.1:{b.cluster.gateway_port}", token=b.inputs.token)
    examples = ["synth-examples/implement-roman", "synth-examples/word-frequencies"]
    body = {
        "kind": "evaluate",
        "dataset": b.inputs.examples.reference,
        "actor": b.inputs.oracle,
        "plan": {"task_names": examples, "max_concurrency": 2},
    }
    first = client.submit(body)
    watch = Watch(hosts=[b.host_a])
    watch.start()
    wait_until(lambda: trials_of(first, status="running"), timeout=120, what="a running trial")
    t_kill = time.monotonic()
    b.cluster.kill(gateway)
    watch.fault(affected=[])
    log("gateway-restart: killed the gateway; the client submits during the outage")
    restarter = threading.Thread(target=lambda: (time.sleep(1.0), b.cluster.gateway()), daemon=True)
    restarter.start()
    second = client.submit(body)  # retried until the gateway is back
    answered_s = round(time.monotonic() - t_kill, 2)
    restarter.join(timeout=120)
    runs = [client.poll(first, timeout=240), client.poll(second, timeout=240)]
    watch.stop()
    result = tally(
        name="gateway-restart",
        cluster=b.cluster,
        run_ids=[first, second],
        hosts=[b.host_a],
        watch=watch,
        recovery_s=answered_s,
        notes={"client_retries": client.errors, "statuses_seen_by_client": [r["status"] for r in runs]},
    )
    result.finished = result.finished and all(r["status"] == "succeeded" for r in runs)
    return result


def scenario_second_host(b: Bench) -> Result:
    b.control()
    dead = b.trials(host=b.host_a, tag="a")
    run_id = run_submit_as(b.inputs, dataset=b.inputs.sleeps, plan=sleep_plan(seconds=6, attempts=2))
    watch = Watch(hosts=[b.host_a, b.host_b])
    watch.start()
    affected = [t.id for t in running(run_id, count=2, for_s=0.5)]
    b.trials(host=b.host_b, tag="b")  # idle: the run's every trial is on host A
    fault = now()
    b.cluster.kill(dead)
    watch.fault(affected=affected)
    log(f"second-host: host A died holding {affected}; host B takes over")
    run_wait(run_id, timeout=180)
    nodes = Counter(t.worker_node for t in trials_of(run_id))
    rec = recovery(run_id=run_id, fault=fault, affected=affected, watch=watch)
    # Host A comes back (a new worker on it): what its dead worker left there goes.
    b.trials(host=b.host_a, tag="a")
    watch.stop()
    result = tally(
        name="second-host",
        cluster=b.cluster,
        run_ids=[run_id],
        hosts=[b.host_a, b.host_b],
        watch=watch,
        recovery_s=rec,
        notes={"finished_on": dict(nodes)},
    )
    result.finished = result.finished and set(nodes) == {b.host_b.name}
    return result


RUNNERS: dict[str, Callable[[Bench], Result]] = {
    "trials-kill": scenario_trials_kill,
    "child-kill": scenario_child_kill,
    "training-kill": scenario_training_kill,
    "redis-restart": scenario_redis_restart,
    "postgres-restart": scenario_postgres_restart,
    "gateway-restart": scenario_gateway_restart,
    "second-host": scenario_second_host,
}


# --------------------------------------------------------------------------- main


def platform_env(*, base: Path, pg: PrivatePostgres, redis: PrivateRedis, host: Host) -> dict[str, str]:
    """The environment of every platform process (and of this one): the private services only."""
    inherited = {
        k: v for k, v in os.environ.items() if not k.startswith(("SYNTH_", "DATABASE_URL", "CELERY_", "DJANGO_"))
    }
    var = base / "var"
    return {
        **inherited,
        "DJANGO_SETTINGS_MODULE": "synth_project.settings",
        "DATABASE_URL": pg.url,
        "CELERY_BROKER_URL": redis.url,
        "SYNTH_VAR_DIR": str(var),
        "SYNTH_OBJECT_STORE": f"file://{var / 'objects'}",
        "SYNTH_PUBLIC_URL": f"http://127.0.0.1:{free_port()}",
        "SYNTH_PROXY_SOCKET": str(base / "run" / "proxy.sock"),
        "SYNTH_TOKENIZER_DIR": os.environ.get("SYNTH_TOKENIZER_DIR", TOKENIZER_DIR),
        "SYNTH_LEASE_TTL_SECONDS": str(LEASE_TTL),
        "SYNTH_DB_RETRY_SECONDS": str(2 * LEASE_TTL),
        # The reaper (SYNTH_REAPER_INTERVAL) or the sweeper (SYNTH_SWEEP_*), whichever this
        # version has; lost messages are re-driven after a lease TTL.
        "SYNTH_REAPER_INTERVAL": "1",
        "SYNTH_SWEEP_INTERVAL": "1",
        "SYNTH_SWEEP_GRACE_SECONDS": str(LEASE_TTL),
        "SYNTH_SWEEP_TRIAL_GRACE_SECONDS": str(LEASE_TTL),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "SYNTH_LOG_LEVEL": "INFO",
        # Every process is on host A unless told otherwise: what it reaps is this bench's.
        **host.env(),
    }


def summary(results: list[Result]) -> dict[str, Any]:
    recoveries = [r.recovery_s for r in results]
    return {
        "scenarios": len(results),
        "runs_finished": sum(r.finished for r in results),
        "trials_counted_twice": sum(r.counted_twice for r in results),
        "reservations_leaked": sum(r.reservations_leaked for r in results),
        "sandboxes_left": sum(r.sandboxes_left for r in results),
        "results_lost": sum(r.results_lost for r in results),
        "max_recovery_s": None if None in recoveries else max(recoveries, default=0.0),
        "per_scenario": {
            r.name: {
                "finished": r.finished,
                "recovery_s": r.recovery_s,
                "counted_twice": r.counted_twice,
                "reservations_leaked": r.reservations_leaked,
                "sandboxes_left": r.sandboxes_left,
                "results_lost": r.results_lost,
                **r.notes,
            }
            for r in results
        },
    }


def host_clean(hosts: list[Host]) -> None:
    """Between scenarios (every worker stopped): nothing of one is left for the next."""
    from synth_sandbox.sandbox import reap_stale_sandboxes

    for host in hosts:
        reap_stale_sandboxes(host.sandbox_root)
        shutil.rmtree(host.work, ignore_errors=True)
        host.work.mkdir(parents=True)


def bench_make(*, base: Path, pg: PrivatePostgres, redis: PrivateRedis, quick: bool, training: bool) -> Bench:
    """Django in this process on the private services, the inputs, the two hosts' dirs."""
    hosts = [Host(name=f"host-{n}", tmp=base / n, work=base / f"work-{n}") for n in ("a", "b")]
    for host in hosts:
        host.tmp.mkdir(parents=True)
        host.work.mkdir(parents=True)
    (base / "run").mkdir()
    env = platform_env(base=base, pg=pg, redis=redis, host=hosts[0])
    os.environ.clear()
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import logging

    import django

    django.setup()
    logging.getLogger().setLevel(logging.WARNING)
    inputs = inputs_make(base=base, training=training)
    cluster = Cluster(base=base, env=env)
    return Bench(
        base=base, pg=pg, redis=redis, cluster=cluster, inputs=inputs, quick=quick, host_a=hosts[0], host_b=hosts[1]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--quick", action="store_true", help=f"{', '.join(QUICK)} only, with fewer trials")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs) afterwards")
    args = parser.parse_args()
    names = list(QUICK) if args.quick else [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)}")

    # Short: a sandbox's socket path (sun_path, 108 bytes) lies below the host's TMPDIR.
    base = Path(tempfile.mkdtemp(prefix="sf-", dir="/tmp"))
    os.chmod(base, 0o711)  # the sandbox uid must reach the sandbox root below it
    pg, redis = PrivatePostgres(base / "pg"), PrivateRedis(base / "redis")
    cluster = None
    results: list[Result] = []
    try:
        pg.start()
        redis.start()
        bench = bench_make(base=base, pg=pg, redis=redis, quick=args.quick, training="training-kill" in names)
        cluster = bench.cluster
        hosts = [bench.host_a, bench.host_b]
        for name in names:
            log(f"{name}: starting")
            try:
                result = RUNNERS[name](bench)
            except Exception as exc:  # noqa: BLE001 - a scenario that breaks is reported, the next one runs
                log(f"{name}: {type(exc).__name__}: {exc}")
                result = Result(name=name, finished=False, detail=f"{type(exc).__name__}: {exc}", recovery_s=None)
            finally:
                cluster.stop()
                host_clean(hosts)
            results.append(result)
            print(result.line(), flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        redis.stop()
        pg.stop()
        if args.keep:
            print(f"kept {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(summary(results)), flush=True)


if __name__ == "__main__":
    main()
