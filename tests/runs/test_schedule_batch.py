"""The gateway process' admitted runs reach the control worker in batches
(apps.runs.services.run_schedule_enqueue): one "runs.schedule_many" message for a burst of
submissions, each run of it scheduled, one that fails leaving the others scheduled."""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from django.db import connection

from apps.runs.models import Run, RunStatus
from apps.runs.services import SCHEDULES, run_schedule_many, run_submit
from tests.trials.conftest import ROOT, Stack, stack  # noqa: F401 - the stack fixture, shared
from tests.trials.test_recovery import free_port


@pytest.fixture(autouse=True)
def _no_process_batcher():
    SCHEDULES.forget()
    yield
    SCHEDULES.forget()


def test_the_gateways_submissions_go_to_the_control_queue_as_one_message(
    alice, inputs, settings, django_capture_on_commit_callbacks
):
    settings.SYNTH_GATEWAY_PROCESS = True
    settings.SYNTH_GATEWAY_SCHEDULE_BATCH_SECONDS = 30  # nothing leaves before the flush below
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("control")
    ids = []
    for n in range(3):
        with django_capture_on_commit_callbacks(execute=True):
            resp = alice.client.post("/api/runs", inputs["body"], format="json", HTTP_IDEMPOTENCY_KEY=f"k-{n}")
        assert resp.status_code == 201, resp.content
        ids.append(resp.json()["id"])
    assert broker.llen("control") == 0  # gathered, not sent one by one
    SCHEDULES.get(seconds=30).flush()
    messages = broker.lrange("control", 0, -1)
    broker.delete("control")
    assert len(messages) == 1
    message = json.loads(messages[0])
    assert message["headers"]["task"] == "runs.schedule_many"
    assert json.loads(base64.b64decode(message["body"]))[0] == [ids]


def test_a_batch_schedules_every_run_past_one_that_fails(alice, inputs, caplog):
    runs = [run_submit(org=alice.org, user=None, idempotency_key=f"k-{n}", body=inputs["body"])[0] for n in range(3)]
    assert {run.status for run in runs} == {RunStatus.ACCEPTED}
    run_schedule_many(run_ids=[runs[0].id, "run_gone", runs[1].id, runs[2].id])
    assert set(Run.objects.filter(pk__in=[r.id for r in runs]).values_list("status", flat=True)) == {RunStatus.QUEUED}
    assert "scheduling run run_gone failed in a batch; the sweeper will retry" in caplog.text


@pytest.mark.slow
def test_runs_submitted_to_a_gunicorn_gateway_are_scheduled_by_the_control_worker(stack, alice, inputs):  # noqa: F811
    # The deployed shape: gunicorn marks its process as the gateway, its threads' admitted
    # runs leave in "runs.schedule_many" messages, and a real control worker schedules them.
    db = connection.settings_dict
    port = free_port()
    gateway = subprocess.Popen(
        [str(ROOT / ".venv/bin/gunicorn"), "synth_project.wsgi", "-c", "deploy/gunicorn.conf.py"]
        + ["-b", f"127.0.0.1:{port}", "-w", "1"],
        cwd=ROOT,
        env={
            **stack.env,
            "DJANGO_SETTINGS_MODULE": "synth_project.test_settings",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "SYNTH_DEBUG": "false",
            "PYTHONPATH": str(ROOT),
        },
        stdout=subprocess.DEVNULL,
        stderr=(stack.tmp / "gateway.log").open("wb"),
        start_new_session=True,  # stopped with the stack's workers, by process group
    )
    stack.procs.append(gateway)
    worker = stack.start_worker("control", queues="control", concurrency=1)
    url = f"http://127.0.0.1:{port}"
    _wait_for(lambda: _get(f"{url}/healthz") == 200, what="the gateway", stack=stack)

    def submit(n: int) -> str:
        request = urllib.request.Request(
            f"{url}/api/runs",
            data=json.dumps(inputs["body"]).encode(),
            headers={
                "Authorization": f"Bearer {alice.secret}",
                "Content-Type": "application/json",
                "Idempotency-Key": f"gateway-{n}",
            },
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert resp.status == 201
            return json.loads(resp.read())["id"]

    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(submit, range(8)))
    _wait_for(
        lambda: not Run.objects.filter(pk__in=ids, status=RunStatus.ACCEPTED).exists(), what="scheduling", stack=stack
    )
    assert worker.poll() is None
    log = (stack.tmp / "control.log").read_text(errors="replace")
    assert "runs.schedule_many" in log and "runs.schedule[" not in log, log[-3000:]


def _get(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except OSError:
        return None


def _wait_for(check, *, what: str, stack: Stack, seconds: float = 120) -> None:  # noqa: F811
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen\n{stack.logs()}")
        time.sleep(0.2)
