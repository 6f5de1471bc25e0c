from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connections, transaction

from apps.objects.services import object_put
from apps.runs.models import Artifact, RunEvent
from apps.runs.services import event_append, run_cancel
from synth_cli import events as synth_events
from tests.cli.conftest import one_line
from tests.factories import make_dataset_version
from tests.harness.conftest import harness_checked

pytestmark = pytest.mark.django_db(transaction=True)

PLAN = '{"attempts_per_task": 2}'


@pytest.fixture
def dataset(alice) -> str:
    return make_dataset_version(org=alice.org, name="evaluation", version="v1").reference


def _start(synth, dataset: str, recipe_file, *extra: str):
    return synth("run", "start", "--dataset", dataset, "--actor", f"@{recipe_file}", "--plan", PLAN, *extra)


def test_start_is_idempotent_and_runs_can_be_shown_listed_and_cancelled(synth, dataset, recipe_file):
    first = _start(synth, dataset, recipe_file)
    assert first.exit_code == 0, first.stderr
    run_id = one_line(first.stdout)
    assert run_id.startswith("run_")
    assert "started evaluate run on team/evaluation@v1 with agent@1" in first.stderr

    again = _start(synth, dataset, recipe_file)  # a retried identical submit
    assert one_line(again.stdout) == run_id
    assert "already submitted" in again.stderr

    other = _start(synth, dataset, recipe_file, "--idempotency-key", "second", "--kind", "execute")
    other_id = one_line(other.stdout)
    assert other_id != run_id

    run = synth.json("run", "show", run_id)
    assert run["id"] == run_id and run["kind"] == "evaluate"
    assert run["actor"]["profile"] == "agent" and run["actor"]["version"] == 1
    assert run["plan"]["attempts_per_task"] == 2
    human = synth("run", "show", run_id)
    assert human.exit_code == 0 and run_id in human.stdout

    listed = synth.json("run", "list")
    assert [r["id"] for r in listed] == [other_id, run_id]
    assert [r["id"] for r in synth.json("run", "list", "--limit", "1")] == [other_id]
    assert [r["id"] for r in synth.json("run", "list", "--kind", "execute")] == [other_id]
    table = synth("run", "list")
    assert run_id in table.stdout and other_id in table.stdout

    cancelled = synth.json("run", "cancel", run_id)
    assert cancelled["status"] == "cancelled"
    assert one_line(synth("run", "cancel", other_id, "--reason", "wrong kind").stdout) == f"{other_id}: cancelled"
    assert [r["id"] for r in synth.json("run", "list", "--status", "cancelled")] == [other_id, run_id]

    events = synth("run", "events", run_id, "--json")
    assert [json.loads(line)["type"] for line in events.stdout.splitlines()] == ["run.created", "run.cancelled"]
    reasons = {
        rid: json.loads(synth("run", "events", rid, "--json").stdout.splitlines()[-1])["data"]["reason"]
        for rid in (run_id, other_id)
    }
    assert reasons == {run_id: "cancelled by operator", other_id: "wrong kind"}


@pytest.mark.slow
def test_start_with_a_published_profile_and_train(synth, dataset, recipe_file, tmp_path, tokenizer_dir):
    from apps.proxy.models import ModelRoute
    from apps.proxy.routes import DEFAULT_ROUTE, route_upsert

    assert synth("profile", "publish", f"@{recipe_file}", "--name", "coder").exit_code == 0
    run = synth.json("run", "start", "--dataset", dataset, "--actor", "coder", "--plan", PLAN)
    assert run["actor"]["profile"] == "coder" and run["actor"]["version"] == 1
    plan = recipe_file.parent / "train-plan.json"
    plan.write_text(json.dumps({"batch_size": 2, "group_size": 4, "steps": 2}))
    # The actor's route must exist and be trainable: a one-line refusal, nothing created.
    refused = synth("train", "start", "--dataset", dataset, "--actor", "coder@1", "--plan", f"@{plan}")
    assert refused.exit_code == 1 and one_line(refused.stderr) == (
        "synth: model route 'qwen3-8b' does not exist (400)"
    ), refused.stderr
    route_upsert(**{**DEFAULT_ROUTE, "trainable": False})
    refused = synth("train", "start", "--dataset", dataset, "--actor", "coder@1", "--plan", f"@{plan}")
    assert "is not trainable" in refused.stderr
    ModelRoute.objects.filter(name="qwen3-8b").update(trainable=True)
    # The profile's engine is claude-code: the installed build must have passed harness_check.
    refused = synth("train", "start", "--dataset", dataset, "--actor", "coder@1", "--plan", f"@{plan}")
    assert refused.exit_code == 1 and "run `manage.py harness_check claude-code`" in refused.stderr, refused.stderr
    check = harness_checked(engine="claude-code", tmp=tmp_path, tokenizer_dir=tokenizer_dir)
    assert check.passed, check.report["failures"]
    train = synth.json("train", "start", "--dataset", dataset, "--actor", "coder@1", "--plan", f"@{plan}")
    assert train["kind"] == "train"


def test_bad_inputs(synth, dataset, recipe_file, tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text('{"attempts_per_task": 2,}')
    result = synth("run", "start", "--dataset", dataset, "--actor", f"@{recipe_file}", "--plan", f"@{bad}")
    assert result.exit_code == 2
    assert one_line(result.stderr).startswith(f"synth: {bad}: invalid JSON at line 1 column 25: ")

    result = synth("run", "start", "--dataset", "evaluation@v1", "--actor", f"@{recipe_file}", "--plan", PLAN)
    assert result.exit_code == 2
    assert "malformed dataset reference 'evaluation@v1'" in one_line(result.stderr)

    result = synth("run", "start", "--dataset", "team/unknown@v9", "--actor", f"@{recipe_file}", "--plan", PLAN)
    assert result.exit_code == 1
    assert one_line(result.stderr) == "synth: dataset team/unknown@v9 not found (404)"

    result = synth("run", "start", "--dataset", dataset, "--actor", "nobody@2", "--plan", PLAN)
    assert result.exit_code == 1 and "no version 2 of profile 'nobody'" in one_line(result.stderr)

    result = synth(
        "run", "start", "--dataset", dataset, "--actor", f"@{recipe_file}", "--plan", '{"attempts_per_tsk": 2}'
    )
    assert result.exit_code == 1 and "attempts_per_tsk" in one_line(result.stderr)

    result = synth("run", "start", "--dataset", dataset, "--plan", PLAN)  # typer's own usage error
    assert result.exit_code == 2

    result = synth("run", "show", "run_doesnotexist")
    assert result.exit_code == 1 and "not found" in one_line(result.stderr)


def test_run_views_list_what_a_new_run_has(synth, dataset, recipe_file):
    run_id = one_line(_start(synth, dataset, recipe_file).stdout)
    for view in ("trials", "artifacts", "checkpoints", "updates"):
        result = synth("run", view, run_id, "--json")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout) == []
        assert synth("run", view, run_id).exit_code == 0
        result = synth("run", view, "run_doesnotexist")
        assert result.exit_code == 1 and one_line(result.stderr) == "synth: run run_doesnotexist not found (404)"
    # A status no record can hold is the server's 400, one line, not an empty list.
    result = synth("run", "trials", run_id, "--status", "sucess")
    assert result.exit_code == 1 and one_line(result.stderr).startswith('synth: status: "sucess" is not one of: ')
    result = synth("run", "list", "--status", "runing")
    assert result.exit_code == 1 and '"runing" is not one of: accepted, queued' in one_line(result.stderr)


def test_regrade_submits_a_judged_rerun_of_retained_work(synth, alice, dataset, recipe_file):
    from apps.runs.models import Run, Trial

    run_id = one_line(_start(synth, dataset, recipe_file).stdout)
    result = synth("run", "regrade", run_id, "--judge", f"@{recipe_file}", "--judge-name", "judge")
    assert result.exit_code == 1
    assert one_line(result.stderr).startswith(f"synth: run {run_id} is ") and "once it has ended" in result.stderr

    # The run ends with one attempt's workdir retained (as a worker would have stored it).
    from apps.runs.dispatch import run_dispatch

    Run.objects.filter(pk=run_id).update(status="queued")
    run_dispatch(run_id=run_id)
    trial = Trial.objects.filter(run_id=run_id).first()
    obj = object_put(org=alice.org, data=b"print('work')\n")
    Artifact.objects.create(
        run_id=run_id, trial=trial, name="artifacts/workdir/main.py", kind="work", object=obj, sha256=obj.sha256, size=3
    )
    Run.objects.filter(pk=run_id).update(status="succeeded")

    result = synth("run", "regrade", run_id, "--judge", f"@{recipe_file}", "--judge-name", "judge")
    assert result.exit_code == 0, result.stderr
    regrade_id = one_line(result.stdout)
    again = synth.json("run", "regrade", run_id, "--judge", "judge@1")
    assert again["id"] == regrade_id and again["kind"] == "regrade"  # the same request, the same run
    assert again["plan"]["source_run"] == run_id and again["judge"]["profile"] == "judge"
    result = synth("run", "regrade", "run_doesnotexist", "--judge", "judge@1")
    assert result.exit_code == 1 and one_line(result.stderr) == "synth: run run_doesnotexist not found (404)"


def test_artifacts_download_through_their_read_grants(synth, alice, dataset, recipe_file, settings, live_server):
    settings.SYNTH_PUBLIC_URL = live_server.url  # where the filesystem store's grants point
    run_id = one_line(_start(synth, dataset, recipe_file).stdout)
    files = {"logs/agent.txt": b"agent log\n", "reward.txt": b"1\n"}
    for name, data in files.items():
        obj = object_put(org=alice.org, data=data)
        Artifact.objects.create(run_id=run_id, name=name, kind="log", object=obj, sha256=obj.sha256, size=len(data))
    listed = synth("run", "artifacts", run_id, "--json")
    assert listed.exit_code == 0, listed.stderr
    assert sorted(a["name"] for a in json.loads(listed.stdout)) == sorted(files)
    out = synth.tmp / "out"
    result = synth("run", "artifacts", run_id, "--download", str(out))
    assert result.exit_code == 0, result.stderr
    for name, data in files.items():
        assert (out / name).read_bytes() == data
    assert "sha256 verified" in result.stderr


def test_follow_prints_every_event_once_in_order_across_reconnects(synth, alice, dataset, recipe_file, monkeypatch):
    run_id = one_line(_start(synth, dataset, recipe_file).stdout)
    connections_opened: list[int] = []
    real_open = synth_events._open

    def counting_open(api, run_id, *, after, server_timeout):
        connections_opened.append(after)
        return real_open(api, run_id, after=after, server_timeout=server_timeout)

    monkeypatch.setattr(synth_events, "_open", counting_open)
    total = 30

    def produce() -> None:
        try:
            for i in range(total):
                with transaction.atomic():
                    event_append(run_id=run_id, type="progress.tick", data={"i": i})
                time.sleep(0.08)  # ~2.4 s of events against a 1 s server stream timeout
            run_cancel(org=alice.org, run_id=run_id, reason="end of test")
        finally:
            connections.close_all()

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        # The server closes the stream every second; the CLI must resume from its cursor.
        result = synth("run", "events", run_id, "--follow", "--server-timeout", "1", "--json")
    finally:
        producer.join()
    assert result.exit_code == 1, result.stderr  # cancelled is not success
    assert one_line(result.stderr) == f"synth: run {run_id} cancelled"
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    stored = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    assert [e["seq"] for e in printed] == stored  # every event once, in order
    assert len(stored) == total + 2  # run.created + ticks + run.cancelled
    assert printed[-1]["type"] == "run.cancelled"
    assert len(connections_opened) >= 3, connections_opened
    assert connections_opened == sorted(connections_opened) and connections_opened[0] == 0

    # Following a finished run prints the rest after --after, then ends at once.
    tail = synth("run", "events", run_id, "--follow", "--after", str(stored[-2]))
    assert tail.exit_code == 1
    assert "run.cancelled" in one_line(tail.stdout)


def test_follow_exits_0_when_the_run_succeeded(synth, dataset, recipe_file, monkeypatch):
    from apps.runs.models import Run, RunStatus

    run_id = one_line(_start(synth, dataset, recipe_file).stdout)
    with transaction.atomic():
        Run.objects.filter(pk=run_id).update(status=RunStatus.SUCCEEDED)
        event_append(run_id=run_id, type="run.succeeded", data={})
    monkeypatch.setenv("SYNTH_FOLLOW_SERVER_TIMEOUT", "1")
    result = synth("run", "events", run_id, "-f")
    assert result.exit_code == 0, result.stderr
    assert [line.split()[3] for line in result.stdout.splitlines()] == ["run.created", "run.succeeded"]
