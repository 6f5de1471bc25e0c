"""A train run mixing two actors on one model route takes an update step from both.

Live workers, the proxy process (tiny Qwen3-vocabulary model, local sampler), two synth-mini
profiles whose harness settings differ, the local backend: every group runs one actor, the
update learns from groups of both, and the summary has each actor's figures."""

from __future__ import annotations

import json

import pytest

from apps.datasets.services import dataset_import_dir
from apps.objects.services import object_read
from apps.proxy.models import Interaction
from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
from apps.runs.models import Artifact, Run, SamplingGroup
from apps.training.models import LearningUpdate, UpdateStatus
from tests.harness.conftest import proxy_start
from tests.trials.conftest import EXAMPLES, wait_for
from tests.trials.test_end_to_end import publish

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_train_run_of_two_actors_updates_from_groups_of_both(stack, alice, proxy_socket, tokenizer_dir, settings):
    settings.SYNTH_PROXY_SOCKET = proxy_socket
    route_upsert(**DEFAULT_ROUTE)
    dataset, _ = dataset_import_dir(org=alice.org, name="toys", version="v1", path=EXAMPLES / "train-tasks")
    stack.env.update({"SYNTH_PROXY_SOCKET": str(proxy_socket)})
    proxy_start(stack, socket_path=proxy_socket, tokenizer_dir=tokenizer_dir)
    stack.start_worker("control", queues="control,evidence", concurrency=2, beat=True)
    stack.start_worker("trials", queues="trials", concurrency=3)
    stack.start_worker("training", queues="training", concurrency=1)

    short = json.loads((EXAMPLES / "train-agent.json").read_text())
    longer = {**short, "args": ["--max-turns", "1", "--max-tokens", "16"]}
    actors = [publish(alice, "mini-24", short), publish(alice, "mini-16", longer)]
    plan = {
        "backend": "local",
        "batch_size": 2,
        "group_size": 3,
        "steps": 1,
        "learning_rate": 0.02,
        "lora_rank": 4,
        "max_concurrency": 6,
        "eligibility": {"require_reward_variance": False},
    }
    resp = alice.client.post(
        "/api/runs", {"kind": "train", "dataset": dataset.reference, "actors": actors, "plan": plan}, format="json"
    )
    assert resp.status_code == 201, resp.content
    run_id = resp.json()["id"]
    run = wait_for(
        lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=300, what="the train run", stack=stack
    )
    assert run.status == "succeeded", (run.error, stack.logs())

    groups = list(SamplingGroup.objects.filter(run=run).select_related("actor__profile").order_by("position"))
    assert [g.actor.profile.name for g in groups] == ["mini-24", "mini-16"]
    for group in groups:
        trial_ids = list(group.trials.values_list("id", flat=True))
        assert len(trial_ids) == 3
        # Each attempt ran its group's actor: its launch plan has that actor's arguments,
        # and the proxy served it on the run's one route.
        wanted = "24" if group.actor.profile.name == "mini-24" else "16"
        for plan_artifact in Artifact.objects.filter(trial_id__in=trial_ids, name="launch-plan.json"):
            argv = json.loads(object_read(obj=plan_artifact.object))["argv"]
            assert argv[argv.index("--max-tokens") + 1] == wanted, argv
        assert Artifact.objects.filter(trial_id__in=trial_ids, name="launch-plan.json").count() == 3
        calls = Interaction.objects.filter(trial_id__in=trial_ids, role="actor")
        assert calls.exists() and {c.route.name for c in calls.select_related("route")} == {"qwen3-8b"}

    (update,) = LearningUpdate.objects.filter(run=run)
    assert update.status == UpdateStatus.APPLIED, update.metrics
    assert update.datums > 0 and update.metrics["grad_norm"] > 0
    assert {g["group"] for g in update.groups} == {g.id for g in groups}, update.groups

    per_actor = run.summary["per_actor"]
    assert [(a["profile"], a["engine"], a["groups"], a["trials"]) for a in per_actor] == [
        ("mini-24", "synth-mini", 1, 3),
        ("mini-16", "synth-mini", 1, 3),
    ]
    assert all(a["mean_reward"] is not None for a in per_actor), per_actor
