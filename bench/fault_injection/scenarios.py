"""The fault scenarios: each starts its processes, injects one fault while work runs, waits
for the runs and tallies what the fault cost."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.fault_injection.cluster import Cluster, Host, Proc
from bench.fault_injection.common import LEASE_TTL, log, wait_until
from bench.fault_injection.inputs import Inputs, run_submit_as, sleep_plan
from bench.fault_injection.observe import Watch, db, now, run_wait, running, trials_of
from bench.fault_injection.report import Result, recovery, tally
from bench.fault_injection.services import PrivatePostgres, PrivateRedis


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
