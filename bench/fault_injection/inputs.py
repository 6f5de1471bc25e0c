"""What the scenarios run: the organization, the example and sleep datasets, the oracle and
training profiles, and run submission."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.fault_injection.common import ROOT


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
