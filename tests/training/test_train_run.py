"""A train run through the whole platform, driven by the `synth` CLI.

CLI -> live API -> admission -> Celery control/trials/training/evidence workers -> groups of
synth-mini attempts in the bubblewrap sandbox -> the proxy process (tiny Qwen3-vocabulary
model, local sampler) -> graded rewards -> the learner: evidence joined to rewards,
group-centred advantages, datums, a LoRA update with the local backend, a checkpoint in the
object store -> the next batch sampled by the proxy FROM THAT CHECKPOINT -> the run ends ->
an evaluation in which the real Claude Code runs on the final checkpoint.
"""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from apps.datasets.services import dataset_import_dir
from apps.proxy.models import Interaction
from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
from apps.runs.models import Run, SamplingGroup
from apps.training.models import Checkpoint, LearningUpdate, Trainer, TrainerStatus, UpdateStatus
from tests.cli.conftest import one_line
from tests.harness.conftest import proxy_start
from tests.trials.conftest import EXAMPLES, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PLAN = {
    "backend": "local",
    "batch_size": 2,
    "group_size": 3,
    "steps": 2,
    "learning_rate": 0.02,
    "lora_rank": 4,
    "save_every": 2,
    "max_concurrency": 6,
}


def test_a_train_run_updates_weights_and_the_next_batch_samples_its_checkpoint(
    stack, synth, alice, tmp_path, proxy_socket, tokenizer_dir, settings
):
    settings.SYNTH_PROXY_SOCKET = proxy_socket
    route_upsert(**DEFAULT_ROUTE)
    dataset, _ = dataset_import_dir(org=alice.org, name="toys", version="v1", path=EXAMPLES / "train-tasks")
    env = {"SYNTH_PROXY_SOCKET": str(proxy_socket)}
    stack.env.update(env)
    proxy_start(stack, socket_path=proxy_socket, tokenizer_dir=tokenizer_dir)
    stack.start_worker("control", queues="control,evidence", concurrency=2, beat=True)
    stack.start_worker("trials", queues="trials", concurrency=3)
    stack.start_worker("training", queues="training", concurrency=1)

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    result = synth(
        "train", "start", "--dataset", dataset.reference, "--actor", f"@{EXAMPLES / 'train-agent.json'}",
        "--plan", f"@{plan}",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    run_id = one_line(result.stdout)

    run = wait_for(
        lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r,
        timeout=300,
        what="the train run to end",
        stack=stack,
    )
    assert run.status == "succeeded", (run.error, stack.logs())
    trainer = Trainer.objects.get(run=run)
    assert trainer.status == TrainerStatus.DONE and trainer.step == 2

    updates = list(LearningUpdate.objects.filter(run=run).order_by("step"))
    assert [u.status for u in updates] == [UpdateStatus.APPLIED, UpdateStatus.APPLIED]
    checkpoints = list(Checkpoint.objects.filter(run=run).order_by("step"))
    assert [c.step for c in checkpoints] == [1, 2]
    assert checkpoints[1].parent_id == checkpoints[0].id and checkpoints[1].milestone
    assert all(c.snapshot == f"object:sha256:{c.sha256}" and c.state_path.startswith("object:") for c in checkpoints)

    # Step 0 sampled the base route; step 1 sampled checkpoint 1, and the proxy says so.
    groups = {g.step: g for g in SamplingGroup.objects.filter(run=run)}
    assert groups[0].sampler == {"route": "qwen3-8b"}
    assert groups[1].sampler == checkpoints[0].binding()
    step1_trials = list(SamplingGroup.objects.filter(run=run, step=1).values_list("trials__id", flat=True))
    served = Interaction.objects.filter(trial_id__in=step1_trials)
    assert served.exists()
    assert all(i.snapshot["adapter_dir"].endswith(checkpoints[0].sha256) for i in served)
    base_served = Interaction.objects.filter(run_id=run_id).exclude(trial_id__in=step1_trials)
    assert base_served.exists() and all(i.snapshot.get("adapter") is None for i in base_served)

    for update in updates:
        metrics = update.metrics
        assert update.datums > 0 and update.sampled_tokens > 0
        assert metrics["attempts_qualified"] > 0 and metrics["grad_norm"] > 0
        # Sampler logprobs (captured by the proxy) match the trainer's: on-policy at step 0
        # with the base weights AND at step 1 with the checkpoint's.
        assert abs(metrics["kl_sample_train"]) < 1e-3, metrics

    # The operator's views: CLI over the REST API.
    listed = synth.json("run", "checkpoints", run_id)
    assert [c["id"] for c in listed] == [c.id for c in checkpoints]
    assert listed[0]["model"] == {"checkpoint": checkpoints[0].id}
    assert listed[0]["digest"] == f"sha256:{checkpoints[0].sha256}"
    table = synth("run", "checkpoints", run_id)
    assert table.exit_code == 0 and checkpoints[0].id in table.stdout
    listed_updates = synth.json("run", "updates", run_id)
    assert [u["status"] for u in listed_updates] == ["applied", "applied"]
    assert [c["step"] for c in listed] == [u["step"] for u in listed_updates] == [0, 1]
    full = synth.json("run", "show", run_id)["summary"]
    groups = SamplingGroup.objects.filter(run=run)
    # Every top-level figure counts the whole run: distinct tasks, groups of every step.
    assert full["tasks"] == len({g.task_version_id for g in groups}) and full["groups"] == groups.count()
    summary = full["training"]
    assert summary["final_checkpoint"] == checkpoints[1].id and summary["applied"] == 2

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.secret}")
    detail = client.get(f"/api/checkpoints/{checkpoints[0].id}").json()
    lineage = detail["lineage"]
    # One numbering: the update of step 0 saved the checkpoint of step 0.
    assert lineage["produced_by"] == {"run": run_id, "step": 0, "update": updates[0].id}
    assert updates[0].step == 0
    assert {g["id"] for g in lineage["sampled_groups"]} == {g.id for g in SamplingGroup.objects.filter(run=run, step=1)}
    assert client.get(f"/api/checkpoints/{checkpoints[1].id}").json()["lineage"]["ancestors"][0]["id"] == (
        checkpoints[0].id
    )

    # The same harness family, the real Claude Code, evaluates with the final checkpoint:
    # the proxy serves it the trained adapter, and the lineage records the selection.
    recipe = json.loads((EXAMPLES / "agent.json").read_text())
    recipe.update(
        model={"checkpoint": checkpoints[1].id},
        args=["--max-turns", "1"],
        env={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "32"},
        limits={"timeout_sec": 180},
    )
    agent = tmp_path / "agent-ckpt.json"
    agent.write_text(json.dumps(recipe))
    plan.write_text(json.dumps({"attempts_per_task": 1, "task_names": ["*plain-reply"]}))
    result = synth("run", "start", "--dataset", dataset.reference, "--actor", f"@{agent}", "--plan", f"@{plan}")
    assert result.exit_code == 0, result.stderr
    eval_id = one_line(result.stdout)
    evaluation = wait_for(
        lambda: (r := Run.objects.get(pk=eval_id)).is_terminal and r, timeout=240, what="the evaluation", stack=stack
    )
    (trial,) = evaluation.trials.all()
    assert trial.status == "succeeded", (trial.error_type, trial.error_message, stack.logs())
    assert evaluation.spec.model_binding == checkpoints[1].binding()
    claude_calls = Interaction.objects.filter(trial_id=trial.id)
    assert claude_calls.exists()
    assert all(i.snapshot["adapter_dir"].endswith(checkpoints[1].sha256) for i in claude_calls)
    assert all(i.prompt_tokens > 1000 for i in claude_calls)  # Claude Code's own system prompt and tools
    lineage = client.get(f"/api/checkpoints/{checkpoints[1].id}").json()["lineage"]
    assert lineage["selected_by_runs"] == [eval_id]


def test_a_cheating_attempt_gives_the_update_no_signal(stack, alice, proxy_socket, tokenizer_dir, settings):
    """Half the attempts of each group start reward-writing processes during setup, then do
    their real work. Without the agent/verification boundary they would score 7 (a value no
    honest verification of these tasks gives) and pull the update their way; behind it they
    are killed before the verifier runs, and every reward the learner sees is a real one."""
    from tests.cheats import PROCESS_TECHNIQUES, cheating_setup
    from tests.trials.test_end_to_end import publish, submit

    settings.SYNTH_PROXY_SOCKET = proxy_socket
    route_upsert(**DEFAULT_ROUTE)
    dataset, _ = dataset_import_dir(org=alice.org, name="toys", version="v1", path=EXAMPLES / "train-tasks")
    stack.env.update({"SYNTH_PROXY_SOCKET": str(proxy_socket)})
    proxy_start(stack, socket_path=proxy_socket, tokenizer_dir=tokenizer_dir)
    stack.start_worker("control", queues="control,evidence", concurrency=2, beat=True)
    stack.start_worker("trials", queues="trials", concurrency=3)
    stack.start_worker("training", queues="training", concurrency=1)
    recipe = json.loads((EXAMPLES / "train-agent.json").read_text())
    recipe["setup"] = [cheating_setup(*PROCESS_TECHNIQUES, reward="7", only_even_attempts=True)]
    # Two attempts per group: attempt 0 cheats, attempt 1 does not.
    plan = {**PLAN, "steps": 1, "group_size": 2, "eligibility": {"require_reward_variance": False}}
    run_id = submit(alice, kind="train", dataset=dataset.reference, actor=publish(alice, "cheater", recipe), plan=plan)
    run = wait_for(
        lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=300, what="the run", stack=stack
    )
    assert run.status == "succeeded", (run.error, stack.logs())
    trials = list(run.trials.all())
    assert len(trials) == 4 and all(t.status == "succeeded" for t in trials), [
        (t.error_type, t.error_message) for t in trials
    ]
    assert all(0.0 <= t.reward <= 1.0 for t in trials), [t.reward for t in trials]
    (update,) = LearningUpdate.objects.filter(run=run)
    assert update.status == UpdateStatus.APPLIED and update.metrics["attempts_qualified"] == 4
    rewards = [r for group in update.groups for r in group["rewards"]]
    assert len(rewards) == 4 and max(rewards) <= 1.0, update.metrics
