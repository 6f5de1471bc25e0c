"""Records that admin pages show: a train run part-way through, with rewards, errors,
learning updates, a checkpoint, artifacts and a captured model call (used by
tests/test_admin_pages.py and the browser tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apps.objects.services import object_put
from apps.runs.models import Artifact, Run, Trial, TrialStatus
from apps.training.models import Checkpoint, LearningUpdate, UpdateStatus
from apps.training.services import training_start
from tests.factories import make_train_run

# Per step: mean reward and loss of the learning update (three steps: the chart's points).
CURVE = [(0, 0.25, 1.5), (1, 0.5, 1.25), (2, 0.75, 0.5)]
LOG_TEXT = "agent started\nwrote hello.txt\n<tests passed>\n"


@dataclass
class Scene:
    run: Run
    trial: Trial
    artifact: Artifact
    binary: Artifact
    checkpoint: Checkpoint


def make_train_scene(*, org: Any) -> Scene:
    run = make_train_run(org=org, tasks=2)
    training_start(run_id=run.id)  # step 0's groups: two tasks, two attempts each
    trials = list(Trial.objects.filter(run=run).order_by("group__position", "attempt"))
    # One passed, one scored 0, one failed by the agent's own doing, one still running.
    outcomes = [
        {"status": TrialStatus.SUCCEEDED, "reward": 1.0, "rewards": {"reward": 1.0}},
        {"status": TrialStatus.SUCCEEDED, "reward": 0.0, "rewards": {"reward": 0.0}},
        {"status": TrialStatus.FAILED, "error_type": "AgentTimeoutError", "error_message": "timed out"},
        {"status": TrialStatus.RUNNING},
    ]
    for trial, values in zip(trials, outcomes, strict=False):
        Trial.objects.filter(pk=trial.pk).update(**values)
    trial = trials[0]
    log = object_put(org=org, data=LOG_TEXT.encode(), content_type="text/plain")
    artifact = Artifact.objects.create(
        run=run, trial=trial, name="agent/trial.log", kind="log", object=log, sha256=log.sha256, size=log.size
    )
    blob = object_put(org=org, data=b"\x00\x01binary", content_type="application/octet-stream")
    binary = Artifact.objects.create(
        run=run, trial=trial, name="agent/weights.bin", kind="file", object=blob, sha256=blob.sha256, size=blob.size
    )
    checkpoint = Checkpoint.objects.create(
        org=org,
        run=run,
        step=1,
        backend="local",
        route="qwen3-8b",
        base_model="tiny",
        lora_rank=8,
        snapshot="file://snapshot",
    )
    for step, reward, loss in CURVE:
        LearningUpdate.objects.create(
            run=run,
            step=step,
            sampler={},
            status=UpdateStatus.APPLIED,
            metrics={"reward_mean": reward, "loss_sum": loss},
            checkpoint=checkpoint if step == 0 else None,
        )
    return Scene(run=run, trial=Trial.objects.get(pk=trial.pk), artifact=artifact, binary=binary, checkpoint=checkpoint)
