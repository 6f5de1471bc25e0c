"""A real execution stack for integration tests: Celery worker processes (control and
trials queues) on Redis, against the test's PostgreSQL database and object store."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


# For the workers of a test that kills a worker and waits for its lease to expire.
LOSE_LEASES_FAST = {"SYNTH_LEASE_TTL_SECONDS": "3"}


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        db = connection.settings_dict
        self.env = {
            **os.environ,
            "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "SYNTH_VAR_DIR": str(settings.VAR_DIR),
            "SYNTH_OBJECT_STORE": settings.SYNTH_OBJECT_STORE,
            "SYNTH_WORK_DIR": str(tmp / "work"),
            # Long enough that a heartbeat delayed by a loaded machine (two test processes,
            # sandboxes, a proxy and the database on two cores) never expires a live trial's
            # lease: a test without a sweeper would then wait for ever. The tests of expiry
            # itself ask for a short TTL (LOSE_LEASES_FAST).
            "SYNTH_LEASE_TTL_SECONDS": "30",
            "SYNTH_SWEEP_INTERVAL": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }

    def start_worker(
        self,
        name: str,
        *,
        queues: str = "control,trials",
        concurrency: int = 4,
        beat: bool = False,
        extra_env: dict[str, str] | None = None,
    ) -> subprocess.Popen:
        cmd = [
            str(ROOT / ".venv/bin/celery"),
            "-A",
            "synth_project",
            "worker",
            "-Q",
            queues,
            "-c",
            str(concurrency),
            "-n",
            f"{name}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "INFO",
        ]
        if beat:
            cmd += ["-B", "-s", str(self.tmp / f"{name}-beat")]
        log = open(self.tmp / f"{name}.log", "wb")
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**self.env, **(extra_env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=20)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    self.kill(proc)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in sorted(self.tmp.glob("*.log")))


@pytest.fixture
def stack(transactional_db, tmp_path) -> Iterator[Stack]:
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()  # no stale messages from other tests
    s = Stack(tmp_path)
    try:
        yield s
    finally:
        s.stop()


def wait_for(predicate, *, timeout: float, what: str, stack: Stack | None = None, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{stack.logs() if stack else ''}")
