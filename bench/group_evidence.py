"""What reading one settled group's evidence costs the learner: every model call's published
payload of every attempt (apps.training.evidence.group_attempts, on the path of each group's
contribution and of every lockstep update), against the same reads made one call at a time
(a reference lookup, a GET and json's parse per call, one after the other: how it read them
before),
side by side in one run, on a real S3-protocol server (moto's, in its own process on
loopback) and on the filesystem store.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/synth_bench .venv/bin/python bench/group_evidence.py \\
        [--attempts 8] [--calls 40] [--prompt-tokens 4000] [--rounds 5]

An agent's attempt makes tens to hundreds of model calls; each call's payload holds its
prompt ids, sampled ids and logprobs (here --prompt-tokens prompt ids and 200 sampled ids a
call). The two ways are timed alternately, --rounds times each, and the figures are the
medians. Moto answers in a few milliseconds, a cloud object store in tens: the one-by-one
way's time grows with that latency call by call, the batched way's once per batch of
parallel reads. Prints figures, asserts nothing; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/synth_bench")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")
os.environ.setdefault("SYNTH_VAR_DIR", tempfile.mkdtemp(prefix="synth-bench-evidence-read-"))
os.environ["CELERY_BROKER_URL"] = "memory://localhost/"  # no worker: the bench calls the services


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def s3_start() -> tuple[subprocess.Popen[bytes], str]:
    """moto's S3 server in a process of its own (its own interpreter, as a store is)."""
    import httpx

    port = free_port()
    server = subprocess.Popen(
        [str(ROOT / ".venv/bin/moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(url, timeout=1)
            return server, url
        except httpx.HTTPError:
            time.sleep(0.05)
    server.kill()
    raise RuntimeError("moto_server did not start")


def group_make(*, org: Any, attempts: int, calls: int, prompt_tokens: int) -> Any:
    """A train run's first group of ``attempts`` attempts, each with ``calls`` verified
    model calls whose payloads are in the configured object store."""
    from apps.objects.services import objects_put_many
    from apps.proxy.models import Eligibility, Integrity, Interaction, ModelRoute
    from apps.proxy.routes import DEFAULT_ROUTE
    from apps.runs.models import SamplingGroup, Trial
    from apps.training.services import training_start
    from tests.factories import make_train_run

    run = make_train_run(org=org, tasks=1, steps=1, batch_size=1, group_size=attempts)
    training_start(run_id=run.id)
    group = SamplingGroup.objects.select_related("run__spec", "run__org").get(run=run, step=0)
    trials = list(Trial.objects.filter(group=group).order_by("attempt"))
    rng = random.Random(7)
    payloads: list[tuple[Trial, bytes]] = []
    for trial in trials:
        prompt = [rng.randrange(1, 150_000) for _ in range(prompt_tokens)]
        for _ in range(calls):
            output = [rng.randrange(1, 150_000) for _ in range(200)]
            body = {"prompt_ids": prompt, "output_ids": output, "logprobs": [-rng.random() for _ in output]}
            payloads.append((trial, json.dumps(body).encode()))
            prompt = prompt + output + [rng.randrange(1, 150_000) for _ in range(100)]  # the next call's prompt
    stored = objects_put_many(org=org, blobs=[data for _, data in payloads])
    route = ModelRoute.objects.get(name=DEFAULT_ROUTE["name"])
    Interaction.objects.bulk_create(
        [
            Interaction(
                org=org,
                principal_kind="credential",
                run_id=run.id,
                trial_id=trial.id,
                role="actor",
                route=route,
                model_requested=route.name,
                stop_reason="end_turn",
                integrity=Integrity.VERIFIED,
                eligibility=Eligibility.ELIGIBLE,
                payload_sha256=(sha := hashlib.sha256(data).hexdigest()),
                payload_size=stored[sha].size,
            )
            for trial, data in payloads
        ]
    )
    Trial.objects.filter(group=group).update(status="succeeded", reward=0.5)
    return group


def one_by_one(*, group: Any) -> int:
    """The group's payloads read as before: per call, its reference, its bytes, json's parse."""
    from apps.objects.selectors import object_get
    from apps.objects.services import object_read
    from apps.proxy.models import Interaction

    count = 0
    for interaction in (
        Interaction.objects.filter(org_id=group.run.org_id, run_id=group.run_id, role="actor")
        .select_related("org")
        .order_by("created_at", "id")
    ):
        json.loads(object_read(obj=object_get(org=interaction.org, sha256=interaction.payload_sha256)))
        count += 1
    return count


def memory(*, group: Any) -> dict[str, float]:
    """Python's peak allocation (tracemalloc) while the group is read and packed, against
    what every call's parsed payload takes when all are held at once (how the learner held
    a group until its datums were built)."""
    import tracemalloc

    from apps.objects.services import objects_read_many
    from apps.proxy.models import Interaction
    from apps.training.evidence import group_attempts

    sha256s = list(
        Interaction.objects.filter(org_id=group.run.org_id, run_id=group.run_id, role="actor").values_list(
            "payload_sha256", flat=True
        )
    )
    tracemalloc.start()
    try:
        held = [json.loads(data) for data in objects_read_many(org=group.run.org, sha256s=sha256s).values()]
        every_call, _ = tracemalloc.get_traced_memory()
        del held
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        attempts = group_attempts(group=group)
        _, peak = tracemalloc.get_traced_memory()
        del attempts
    finally:
        tracemalloc.stop()
    return {"packed_peak_mb": round((peak - base) / 2**20, 1), "every_call_held_mb": round(every_call / 2**20, 1)}


def measure(*, group: Any, rounds: int) -> dict[str, float]:
    from apps.training.evidence import group_attempts

    times: dict[str, list[float]] = {"batched": [], "one_by_one": []}
    calls = sum(a.call_count for a in group_attempts(group=group))  # warm: clients, pools
    assert one_by_one(group=group) == calls
    for index in range(rounds):
        order = ("batched", "one_by_one") if index % 2 == 0 else ("one_by_one", "batched")
        for way in order:
            t0 = time.perf_counter()
            if way == "batched":
                group_attempts(group=group)
            else:
                one_by_one(group=group)
            times[way].append(time.perf_counter() - t0)
    batched, serial = statistics.median(times["batched"]), statistics.median(times["one_by_one"])
    return {"calls": calls, "batched_s": round(batched, 3), "one_by_one_s": round(serial, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attempts", type=int, default=8)
    parser.add_argument("--calls", type=int, default=40, help="model calls per attempt")
    parser.add_argument("--prompt-tokens", type=int, default=4000, help="the first call's prompt ids")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from bench.cancel import ensure_database

    ensure_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from apps.accounts.services import org_get_or_create

    server, endpoint = s3_start()
    figures: dict[str, Any] = {"attempts": args.attempts, "calls_per_attempt": args.calls}
    try:
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret")
        stores = {
            "s3": (f"s3://bench-{uuid.uuid4().hex[:8]}/evidence", endpoint),
            "file": (f"file://{tempfile.mkdtemp(prefix='synth-bench-objects-')}", ""),
        }
        for name, (url, endpoint_url) in stores.items():
            settings.SYNTH_OBJECT_STORE = url
            settings.SYNTH_S3_ENDPOINT_URL = endpoint_url
            settings.SYNTH_S3_CREATE_BUCKET = True
            settings.SYNTH_S3_VERIFY = "download"  # moto does not check checksum claims
            org = org_get_or_create(slug=f"evidence-{name}-{int(time.time())}")
            group = group_make(org=org, attempts=args.attempts, calls=args.calls, prompt_tokens=args.prompt_tokens)
            result = measure(group=group, rounds=args.rounds)
            calls = result["calls"]
            print(
                f"{name}: {calls} calls ({args.attempts} attempts x {args.calls}); read together "
                f"{result['batched_s']:.3f} s ({result['batched_s'] / calls * 1000:.2f} ms a call), one by one "
                f"{result['one_by_one_s']:.3f} s ({result['one_by_one_s'] / calls * 1000:.2f} ms a call): "
                f"{result['one_by_one_s'] / result['batched_s']:.1f}x"
            )
            figures[f"{name}_batched_s"] = result["batched_s"]
            figures[f"{name}_one_by_one_s"] = result["one_by_one_s"]
            figures[f"{name}_speedup"] = round(result["one_by_one_s"] / result["batched_s"], 2)
            if name == "file":
                held = memory(group=group)
                print(
                    f"memory: reading and packing the group peaks at {held['packed_peak_mb']} MB of Python "
                    f"allocations; holding every call's payload takes {held['every_call_held_mb']} MB"
                )
                figures.update(held)
    finally:
        server.kill()
    figures["load_average"] = [round(v, 2) for v in os.getloadavg()]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
