"""The commands for people: live progress (in a real pseudo-terminal), run comparison,
metric exports read back with TensorBoard's own reader, the list/show commands, plan
flags, completion and quiet broken pipes, all against a live server."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connections, transaction
from django.utils import timezone

from apps.objects.services import object_put
from apps.profiles.models import ProfileVersion
from apps.runs.dispatch import run_dispatch
from apps.runs.models import Artifact, Run, Trial
from apps.runs.services import run_schedule, run_submit
from apps.runs.settlement import run_finalize
from tests.cli.conftest import one_line
from tests.factories import make_dataset_version, make_profile_version, make_train_run

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _dispatched_run(org, *, key: str, attempts: int = 2, dataset=None) -> Run:
    """An evaluate run expanded into pending trials (no worker picks them up)."""
    dataset = dataset or make_dataset_version(org=org, name=key)
    actor = ProfileVersion.objects.filter(profile__org=org, profile__name="noop").first()
    actor = actor or make_profile_version(org=org)
    body = {
        "kind": "evaluate",
        "dataset": dataset.reference,
        "actor": {"profile": actor.profile.name, "version": actor.version},
        "plan": {"attempts_per_task": attempts},
    }
    run, _ = run_submit(org=org, user=None, idempotency_key=key, body=body)
    run_schedule(run_id=run.id)
    run_dispatch(run_id=run.id)
    return Run.objects.get(pk=run.pk)


def _finish(run: Run, rewards: dict[str, list[float]]) -> None:
    """Each task's trials end with these rewards (in attempt order); then the run ends."""
    now = timezone.now()
    for trial in Trial.objects.filter(run=run).select_related("task_version").order_by("attempt"):
        reward = rewards[trial.task_version.name][trial.attempt]
        Trial.objects.filter(pk=trial.pk).update(status="succeeded", reward=reward, started_at=now, finished_at=now)
    with transaction.atomic():
        run_finalize(run=Run.objects.select_for_update().get(pk=run.pk))


def _read_until(fd: int, buffer: bytearray, needle: str | None, *, deadline: float) -> None:
    """Read the terminal until `needle` shows (ANSI stripped), or until it closes (None)."""
    while time.monotonic() < deadline:
        if needle is not None and needle in ANSI.sub("", buffer.decode(errors="replace")):
            return
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            chunk = b""
        if not chunk:
            assert needle is None, f"the terminal closed before {needle!r}: {buffer.decode(errors='replace')}"
            return
        buffer.extend(chunk)
    raise AssertionError(f"no {needle!r} on the terminal: {buffer.decode(errors='replace')}")


def _cli_env(live_server, alice) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNTH_")}
    env.update(
        SYNTH_API_URL=live_server.url,
        SYNTH_TOKEN=alice.secret,
        SYNTH_HTTP_RETRY_WAIT="0.01",
        PYTHONPATH=str(REPO),
        TERM="xterm-256color",
        COLUMNS="120",
    )
    env.pop("NO_COLOR", None)
    return env


def test_watch_on_a_terminal_shows_live_progress_until_the_run_ends(live_server, alice):
    run = _dispatched_run(alice.org, key="watch")
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "synth_cli.main", "run", "watch", run.id, "--interval", "0.1"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=_cli_env(live_server, alice),
        cwd=REPO,
    )
    os.close(slave)
    output = bytearray()
    try:
        deadline = time.monotonic() + 120  # a guard against a hang, not a timing assertion
        _read_until(master, output, "0/4 trials done", deadline=deadline)
        _finish(run, {"examples/task-0": [1.0, 1.0], "examples/task-1": [0.0, 0.0]})
        _read_until(master, output, None, deadline=deadline)
        assert proc.wait(timeout=60) == 0, output.decode(errors="replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    raw = output.decode(errors="replace")
    assert "\x1b[" in raw  # a live display (cursor movement, colour), not plain lines
    assert "━" in raw  # the progress bar
    screen = ANSI.sub("", raw)
    assert "4/4 trials done" in screen and "mean reward 0.500" in screen and "succeeded" in screen
    assert "0 failed" in screen


def test_watch_off_a_terminal_prints_plain_lines_and_fails_with_the_run(synth, alice):
    run = _dispatched_run(alice.org, key="plain")
    _finish(run, {"examples/task-0": [1.0, 0.0], "examples/task-1": [0.0, 0.0]})
    result = synth("run", "watch", run.id)
    assert result.exit_code == 0, result.stderr
    line = one_line(result.stdout)
    assert "\x1b" not in line
    assert line.startswith(f"{run.id} succeeded, 4/4 done, 0 running, 0 failed, mean reward 0.250, elapsed ")
    assert line.endswith(", ETA -")  # nothing left to estimate

    cancelled = _dispatched_run(alice.org, key="cancelled")
    Run.objects.filter(pk=cancelled.pk).update(status="cancelled")
    result = synth("run", "watch", cancelled.id, "--json")
    assert result.exit_code == 1 and one_line(result.stderr) == f"synth: run {cancelled.id} cancelled"
    progress = json.loads(one_line(result.stdout))
    assert progress["total"] == 4 and progress["pending"] == 4 and progress["done"] == 0


def test_watch_a_train_run_shows_its_step_reward_and_loss(synth, alice):
    from apps.training.models import LearningUpdate

    run = make_train_run(org=alice.org, steps=3)
    LearningUpdate.objects.create(
        run=run, step=0, sampler={}, status="applied", metrics={"reward_mean": 0.25, "loss_sum": 1.5}
    )
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    progress = json.loads(one_line(synth("run", "watch", run.id, "--json").stdout))
    assert progress["kind"] == "train" and progress["steps"] == 3 and progress["steps_done"] == 1
    assert progress["step"] == 2 and progress["last_reward"] == 0.25 and progress["last_loss"] == 1.5
    line = one_line(synth("run", "watch", run.id).stdout)
    assert ", step 2/3, " in line and "last step reward 0.250, loss 1.500" in line


def test_start_follow_submits_then_watches_until_the_run_ends(synth, alice, recipe_file):
    from apps.runs.services import run_cancel

    dataset = make_dataset_version(org=alice.org).reference

    def cancel_once_submitted() -> None:
        # Nothing runs trials here, so the run ends when it is cancelled.
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                run = Run.objects.filter(org=alice.org).first()
                if run is not None:
                    run_cancel(org=alice.org, run_id=run.id, reason="end of test")
                    return
                time.sleep(0.05)
        finally:
            connections.close_all()

    canceller = threading.Thread(target=cancel_once_submitted)
    canceller.start()
    try:
        result = synth(
            "run", "start", "--dataset", dataset, "--actor", f"@{recipe_file}", "--attempts", "3",
            "--follow", "--interval", "0.1", "--json",
        )  # fmt: skip
    finally:
        canceller.join()
    lines = result.stdout.splitlines()
    run = json.loads(lines[0])  # the run object first, then its progress
    assert run["plan"]["attempts_per_task"] == 3
    assert result.exit_code == 1 and one_line(result.stderr) == f"synth: run {run['id']} cancelled"
    progress = [json.loads(line) for line in lines[1:]]
    assert progress and all(p["run"] == run["id"] for p in progress)
    assert progress[-1]["status"] == "cancelled"


def test_plan_flags_are_merged_over_the_plan_file(synth, alice, recipe_file, tmp_path):
    dataset = make_dataset_version(org=alice.org).reference
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"attempts_per_task": 2, "max_concurrency": 4, "sampling": {"max_tokens": 100}}))
    run = synth.json(
        "run",
        "start",
        "--dataset",
        dataset,
        "--actor",
        f"@{recipe_file}",
        "--plan",
        f"@{plan}",
        "--attempts",
        "5",
        "--timeout-multiplier",
        "2.5",
        "--task",
        "examples/task-1",
        "--task",
        "other/*",
    )
    assert run["plan"]["attempts_per_task"] == 5  # the flag wins over the file
    assert run["plan"]["max_concurrency"] == 4 and run["plan"]["sampling"]["max_tokens"] == 100  # the file's rest
    assert run["plan"]["timeout_multiplier"] == 2.5
    assert run["plan"]["task_names"] == ["examples/task-1", "other/*"]
    # Without --plan, the flags alone make the plan.
    bare = synth.json("run", "start", "--dataset", dataset, "--actor", f"@{recipe_file}", "--concurrency", "3")
    assert bare["plan"]["max_concurrency"] == 3
    refused = synth(
        "train",
        "start",
        "--dataset",
        dataset,
        "--actor",
        f"@{recipe_file}",
        "--plan",
        '{"steps": 1}',
        "--attempts",
        "2",
    )
    assert refused.exit_code == 2  # typer: train start has no --attempts


def test_compare_gives_per_task_means_intervals_and_pass_at_k(synth, alice):
    dataset = make_dataset_version(org=alice.org)
    base = _dispatched_run(alice.org, key="a", dataset=dataset)
    _finish(base, {"examples/task-0": [1.0, 0.0], "examples/task-1": [0.0, 0.0]})
    better = _dispatched_run(alice.org, key="b", dataset=dataset)
    _finish(better, {"examples/task-0": [1.0, 1.0], "examples/task-1": [1.0, 0.0]})

    result = synth.json("run", "compare", base.id, better.id)
    assert result["a"] == base.id and result["b"] == better.id
    assert result["method"]["interval"] == "percentile bootstrap" and result["method"]["seed"] == 0
    tasks = {t["task"]: t for t in result["tasks"]}
    first = tasks["examples/task-0"]
    assert first["a"]["mean"] == 0.5 and first["b"]["mean"] == 1.0 and first["diff"]["mean"] == 0.5
    assert first["a"]["pass_at_k"] == {"1": 0.5, "2": 1.0} and first["b"]["pass_at_k"] == {"1": 1.0, "2": 1.0}
    assert first["diff"]["pass_at_k"] == {"1": 0.5, "2": 0.0}
    low, high = first["a"]["ci"]
    assert 0.0 <= low <= 0.5 <= high <= 1.0
    assert first["b"]["ci"] == [1.0, 1.0]  # every resample of two passes is a pass
    overall = result["overall"]
    assert overall["tasks"] == 2
    assert overall["a"]["mean"] == 0.25 and overall["b"]["mean"] == 0.75 and overall["diff"]["mean"] == 0.5
    assert overall["a"]["pass_at_k"]["1"] == 0.25 and overall["diff"]["pass_at_k"]["1"] == 0.5
    d_low, d_high = overall["diff"]["ci"]
    assert d_low <= 0.5 <= d_high
    # A fixed seed: the same runs give the same figures.
    assert synth.json("run", "compare", base.id, better.id) == result

    table = synth("run", "compare", base.id, better.id)
    assert table.exit_code == 0, table.stderr
    assert "examples/task-0" in table.stdout and "(overall)" in table.stdout and "+0.500" in table.stdout
    missing = synth("run", "compare", base.id, "run_doesnotexist")
    assert missing.exit_code == 1 and "not found" in one_line(missing.stderr)


def _train_run_with_updates(alice) -> Run:
    from apps.training.models import LearningUpdate

    run = make_train_run(org=alice.org)
    for step, (reward, loss) in enumerate([(0.25, 2.0), (0.75, 1.25)]):
        LearningUpdate.objects.create(
            run=run,
            step=step,
            sampler={},
            status="applied",
            datums=4,
            sampled_tokens=100 + step,
            metrics={
                "reward_mean": reward,
                "loss_sum": loss,
                "grad_norm": 0.5 + step,
                "kl_sample_train": 0.01 * (step + 1),
                "gather_seconds": 1.0,
                "train_seconds": 2.0,
                "save_seconds": 0.5,
            },
            finished_at=timezone.now(),
        )
    return run


def test_metrics_export_csv_jsonl_and_tensorboard_read_back(synth, alice, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    run = _train_run_with_updates(alice)
    result = synth("run", "metrics", run.id, "--format", "csv")
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["step"] for r in rows] == ["0", "1"]
    assert [float(r["loss"]) for r in rows] == [2.0, 1.25]
    assert rows[1]["grad_norm"] == "1.5" and rows[1]["sampled_tokens"] == "101" and rows[0]["checkpoint"] == ""

    lines = synth("run", "metrics", run.id, "--format", "jsonl").stdout.splitlines()
    assert [json.loads(line)["reward_mean"] for line in lines] == [0.25, 0.75]

    logdir = tmp_path / "tb"
    result = synth("run", "metrics", run.id, "--format", "tensorboard", "--out", str(logdir))
    assert result.exit_code == 0, result.stderr
    accumulator = EventAccumulator(str(logdir))
    accumulator.Reload()
    assert {"train/reward_mean", "train/loss", "train/grad_norm", "train/kl_sample_train"} <= set(
        accumulator.Tags()["tensors"]
    )

    def series(tag: str) -> list[tuple[int, float]]:
        return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in accumulator.Tensors(tag)]

    assert series("train/reward_mean") == [(0, 0.25), (1, 0.75)]
    assert series("train/loss") == [(0, 2.0), (1, 1.25)]
    assert series("train/sampled_tokens") == [(0, 100.0), (1, 101.0)]

    bad = synth("run", "metrics", run.id, "--format", "xml")
    assert bad.exit_code == 2 and "--format must be one of" in one_line(bad.stderr)


def test_list_and_show_commands(synth, alice, bob, settings, live_server):
    from apps.proxy.models import Interaction
    from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
    from apps.training.models import Checkpoint

    settings.SYNTH_PUBLIC_URL = live_server.url  # where the filesystem store's grants point
    run = _train_run_with_updates(alice)
    datasets = synth.json("dataset", "list")
    assert [d["reference"] for d in datasets] == ["team/evaluation@v1"]
    assert "team/evaluation@v1" in synth("dataset", "list").stdout
    profiles = synth.json("profile", "list")
    assert [p["name"] for p in profiles] == ["mini"] and profiles[0]["latest_version"] == 1
    models = synth.json("model", "list")
    assert "qwen3-8b" in [m["name"] for m in models]
    assert "qwen3-8b" in synth("model", "list").stdout

    common = {"org": alice.org, "run": run, "backend": "local", "route": "qwen3-8b", "base_model": "b", "lora_rank": 8}
    first = Checkpoint.objects.create(step=1, snapshot="object:sha256:" + "a" * 64, **common)
    second = Checkpoint.objects.create(step=2, snapshot="object:sha256:" + "b" * 64, parent=first, **common)
    listed = synth.json("checkpoint", "list")
    assert [c["id"] for c in listed] == [second.id, first.id]
    assert [c["id"] for c in synth.json("checkpoint", "list", "--run", "run_other")] == []
    shown = synth.json("checkpoint", "show", second.id)
    assert shown["parent"] == first.id
    assert shown["lineage"]["ancestors"] == [
        {"id": first.id, "run": run.id, "step": 0}
    ]  # shown as the step (from 0) of the update that saved it
    human = synth("checkpoint", "show", second.id)
    assert human.exit_code == 0 and f"{first.id} ({run.id} step 0)" in human.stdout

    route, _ = route_upsert(**DEFAULT_ROUTE)
    run = _dispatched_run(alice.org, key="browse")  # a train run makes its trials only once it learns
    trial = Trial.objects.filter(run=run).first()
    interaction = Interaction.objects.create(
        org=alice.org, principal_kind="attempt", route=route, model_requested="qwen3-8b", run_id=run.id,
        trial_id=trial.id, prompt_tokens=12, output_tokens=3,
    )  # fmt: skip
    assert [i["id"] for i in synth.json("interaction", "list", "--run", run.id)] == [interaction.id]
    assert synth.json("interaction", "show", interaction.id)["prompt_tokens"] == 12
    assert interaction.id in synth("interaction", "list").stdout
    assert "prompt tokens" in synth("interaction", "show", interaction.id).stdout

    shown_trial = synth.json("trial", "show", trial.id)
    assert shown_trial["id"] == trial.id and shown_trial["run"] == run.id
    assert trial.id in synth("trial", "show", trial.id).stdout
    # Another organization sees neither the trial nor the checkpoints.
    assert bob.client.get(f"/api/trials/{trial.id}").status_code == 404
    assert bob.client.get("/api/checkpoints").json()["results"] == []
    gone = synth("trial", "show", "trl_doesnotexist")
    assert gone.exit_code == 1 and one_line(gone.stderr) == "synth: trial trl_doesnotexist not found (404)"

    for name, data, kind in [("agent/log.txt", b"agent says hi\n", "log"), ("work/main.py", b"x=1\n", "work")]:
        obj = object_put(org=alice.org, data=data)
        Artifact.objects.create(
            run=run, trial=trial, name=name, kind=kind, object=obj, sha256=obj.sha256, size=len(data)
        )
    logs = synth("trial", "logs", trial.id)
    assert logs.exit_code == 0, logs.stderr
    assert logs.stdout == "==> agent/log.txt <==\nagent says hi\n"  # retained work is not a log
    assert synth("trial", "logs", trial.id, "--name", "agent/log.txt").stdout == "agent says hi\n"
    assert synth.json("trial", "logs", trial.id) == [
        {"name": "agent/log.txt", "size": 14, "digest": f"sha256:{Artifact.objects.get(name='agent/log.txt').sha256}",
         "text": "agent says hi\n"}
    ]  # fmt: skip


def test_help_offers_completion(offline):
    result = offline("--help")
    assert result.exit_code == 0
    assert "--install-completion" in result.stdout and "--show-completion" in result.stdout


def test_a_closed_pipe_ends_quietly(live_server, alice):
    make_dataset_version(org=alice.org)
    for args in (["--version"], ["dataset", "list", "--json"], ["dataset", "list"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "synth_cli.main", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_cli_env(live_server, alice),
            cwd=REPO,
        )
        proc.stdout.close()  # the reader is gone before anything is written, as `| head` after a line
        stderr = proc.stderr.read()
        assert proc.wait(timeout=60) == 0, (args, stderr)
        assert stderr == b"", (args, stderr)


def test_compare_counts_the_agents_own_failures_as_the_run_summary_does():
    from synth_cli.compare import task_rewards

    run = {"summary": {"per_task": {"t": {"assessed": 3}}}}  # 2 rewarded + 1 agent timeout
    trials = [
        {"task": "t", "reward": 1.0},
        {"task": "t", "reward": 0.5},
        {"task": "t", "reward": None},  # the agent timed out: assessed, as 0
        {"task": "t", "reward": None},  # a platform error: not assessed
    ]
    assert task_rewards(run=run, trials=trials) == {"t": [1.0, 0.5, 0.0]}
    # A run still going has no summary: only rewarded attempts count.
    assert task_rewards(run={"summary": {}}, trials=trials) == {"t": [1.0, 0.5]}
