"""Every accepted run finishes, through real Celery workers, when a process or the broker
dies under it: a SIGKILLed trials worker's reservations are released when a worker starts
on the host (later trials are admitted at once), and trials whose messages a broker restart
lost are handed over again by the sweeper."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
import redis

from apps.runs.models import Reservation, Run, RunEvent, Trial
from tests.factories import make_dataset_of, make_task_version_unchecked
from tests.trials.conftest import wait_for
from tests.trials.test_end_to_end import ORACLE, _task, finished, publish, submit

pytestmark = [pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """A Redis of the test's own, without persistence: a restart loses every message."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.tmp = tmp
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            cwd=self.tmp,
            stdout=subprocess.DEVNULL,
        )
        wait_for(lambda: self._ping(), timeout=20, what="the private redis")

    def _ping(self) -> bool:
        try:
            return redis.Redis.from_url(self.url).ping()
        except redis.ConnectionError:
            return False

    def queued(self, queue: str) -> int:
        """Messages waiting in a Celery queue (a Redis list of that name)."""
        return redis.Redis.from_url(self.url).llen(queue)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)


def test_a_killed_trials_workers_reservations_are_released_when_a_worker_starts(stack, alice, tmp_path):
    slow = _task(
        tmp_path,
        "slow",
        solve="sleep 300",
        toml="[agent]\ntimeout_sec = 600.0\n[environment]\nmemory_mb = 256\nstorage_mb = 64\n",
    )
    quick = _task(
        tmp_path, "quick", toml="[agent]\ntimeout_sec = 60.0\n[environment]\nmemory_mb = 256\nstorage_mb = 64\n"
    )
    slow_dsv = make_dataset_of(
        org=alice.org,
        name="slow",
        version="1",
        task_versions=[make_task_version_unchecked(org=alice.org, path=slow, name="slow")],
    )
    quick_dsv = make_dataset_of(
        org=alice.org,
        name="quick",
        version="1",
        task_versions=[make_task_version_unchecked(org=alice.org, path=quick, name="quick")],
    )
    # One slot on this host, and leases long enough that only the worker start can free it.
    env = {"SYNTH_WORKER_SLOTS": "1", "SYNTH_LEASE_TTL_SECONDS": "600"}
    first = stack.start_worker("first", queues="control,trials", extra_env=env)
    actor = publish(alice, "oracle", ORACLE)
    slow_run = submit(alice, dataset=slow_dsv.reference, actor=actor)
    held = wait_for(
        lambda: Reservation.objects.filter(trial__run_id=slow_run, status="held").first(),
        timeout=90,
        what="the slow trial's reservation",
        stack=stack,
    )
    wait_for(
        lambda: Trial.objects.filter(run_id=slow_run, status="running").exists(), timeout=90, what="the slow trial"
    )
    stack.kill(first)  # SIGKILL, children included: nothing of it releases anything
    assert Reservation.objects.get(pk=held.pk).status == "held"

    stack.start_worker("second", queues="control,trials", extra_env=env)
    wait_for(
        lambda: Reservation.objects.get(pk=held.pk).status == "released",
        timeout=60,
        what="the orphaned reservation to be released at worker start",
        stack=stack,
    )
    event = RunEvent.objects.get(run_id=slow_run, type="reservation.released", data__reservation=held.pk)
    assert event.data["why"] == f"its worker process {held.holder} is gone"
    # A later run on this host is admitted at once, while the dead trial's lease still runs.
    quick_run = submit(alice, dataset=quick_dsv.reference, actor=actor)
    run = finished(quick_run, stack, timeout=120)
    assert run.status == "succeeded", stack.logs()
    assert Run.objects.get(pk=slow_run).status == "running"


def test_trials_a_broker_restart_lost_are_handed_over_again(stack, alice, tmp_path):
    broker = PrivateRedis(tmp_path)
    broker.start()
    try:
        tasks = [
            make_task_version_unchecked(org=alice.org, path=_task(tmp_path, f"t{i}"), name=f"t{i}") for i in range(2)
        ]
        dsv = make_dataset_of(org=alice.org, name="restart", version="1", task_versions=tasks)
        stack.env.update(
            {
                "CELERY_BROKER_URL": broker.url,
                "SYNTH_SWEEP_GRACE_SECONDS": "2",
                "SYNTH_SWEEP_TRIAL_GRACE_SECONDS": "4",
            }
        )
        control = stack.start_worker("control", queues="control", concurrency=2, beat=True)
        # Submitted here, the run's schedule message goes to the suite's broker, which nobody
        # of this stack consumes: a lost message too. The sweeper schedules it.
        run_id = submit(alice, dataset=dsv.reference, actor=publish(alice, "oracle", ORACLE))
        wait_for(
            lambda: Trial.objects.filter(run_id=run_id, status="pending", queued_at__isnull=False).count() == 2,
            timeout=60,
            what="the trials handed to the trials queue",
            stack=stack,
        )
        # The messages are published after the commit that set queued_at: killed before they
        # arrive, the publisher's retry would deliver them to the restarted broker.
        wait_for(lambda: broker.queued("trials") == 2, timeout=60, what="the two trial messages", stack=stack)
        broker.kill()  # no persistence: the two trial messages are gone
        broker.start()
        # A worker whose broker drops while it holds unacknowledged messages exits (kombu's
        # "Unrecoverable error"); its supervisor starts it again, as here.
        stack.kill(control)
        stack.start_worker("control-again", queues="control", concurrency=2, beat=True)
        stack.start_worker("trials", queues="trials", concurrency=2)
        run = finished(run_id, stack, timeout=180)
        assert run.status == "succeeded", stack.logs()
        notes = {
            e["action"]: e
            for e in RunEvent.objects.filter(run_id=run_id, type="sweep.redriven").values_list("data", flat=True)
        }
        assert "scheduled" in notes
        assert notes["trials_requeued"]["count"] >= 1 and "never claimed" in notes["trials_requeued"]["why"]
        assert set(Trial.objects.filter(run_id=run_id).values_list("status", flat=True)) == {"succeeded"}
    finally:
        stack.stop()
        broker.kill()
