"""Exact continuation: N steps, then a new run continuing the last checkpoint for M more,
end with the weights AND optimizer state (Adam moments, step counters) that N + M
uninterrupted steps give, having walked the same tasks; and what cannot continue is
refused at submission with a 400 naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from apps.objects.packages import package_materialize, snapshot_sha256
from apps.proxy.models import ModelRoute
from apps.runs.models import Run, RunEvent, SamplingGroup
from apps.training.backends.local import OPTIMIZER_FILE
from apps.training.models import Checkpoint, Trainer, TrainerStatus, UpdateStatus
from apps.training.services import training_start
from tests.factories import make_dataset_version, make_profile_version
from tests.training.learner_steps import step_play, submit_train

pytestmark = pytest.mark.django_db

PLAN = {"steps": 3, "batch_size": 2, "group_size": 2, "learning_rate": 0.05, "lora_rank": 2, "seed": 3}


def _state(checkpoint: Checkpoint, tmp_path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(adapter tensors, optimizer state dict) of a checkpoint's saved trainer state."""
    digest = snapshot_sha256(checkpoint.state_path)
    directory = package_materialize(sha256=digest, cache_dir=tmp_path / "states", keep=16)
    return load_file(directory / "adapter_model.safetensors"), torch.load(directory / OPTIMIZER_FILE, weights_only=True)


def _train(run, steps: range) -> list[Checkpoint]:
    trainer = training_start(run_id=run.id)
    assert trainer is not None and trainer.status == TrainerStatus.SAMPLING, run.error
    for step in steps:
        assert step_play(run=run, step=step).status == UpdateStatus.APPLIED
    assert Trainer.objects.get(run=run).status == TrainerStatus.DONE
    return list(Checkpoint.objects.filter(run=run).order_by("step"))


def _positions(run, step: int) -> list[int]:
    return list(
        SamplingGroup.objects.filter(run=run, step=step).order_by("position").values_list("position", flat=True)
    )


def test_n_steps_then_m_more_equal_n_plus_m_uninterrupted(alice, tmp_path):
    # Three tasks, two per step: the cursor wraps, so a continuation that restarted the
    # cursor would train step 2 on other tasks.
    dataset = make_dataset_version(org=alice.org, name="cont", tasks=3)
    whole = submit_train(org=alice.org, dataset=dataset, model={"route": "qwen3-8b"}, plan=PLAN, key="whole")
    whole_ckpts = _train(whole, range(3))

    first = submit_train(
        org=alice.org, dataset=dataset, model={"route": "qwen3-8b"}, plan={**PLAN, "steps": 2}, key="a"
    )
    first_ckpts = _train(first, range(2))
    assert first_ckpts[-1].resume == {
        "format": 1, "dataset_cursor": 4, "dataset_digest": dataset.digest, "task_names": [], "seed": 3,
        "optimizer": True,
    }  # fmt: skip

    listed = alice.client.get(f"/api/checkpoints/{first_ckpts[-1].id}").json()
    assert listed["has_state"] and listed["exact_continuation"]

    # The continuation names no lora_rank or seed: the checkpoint's are pinned.
    plan = {k: v for k, v in PLAN.items() if k not in ("lora_rank", "seed")}
    rest = submit_train(
        org=alice.org, dataset=dataset, model={"checkpoint": first_ckpts[-1].id}, plan={**plan, "steps": 1}, key="b"
    )
    assert rest.spec.plan["continuation"] == "exact" and rest.spec.plan["lora_rank"] == 2
    trainer = training_start(run_id=rest.id)
    assert (trainer.step, trainer.first_step, trainer.dataset_cursor) == (2, 2, 6)  # 4 + this batch's 2
    assert _positions(rest, 2) == _positions(whole, 2) == [1, 2]
    assert step_play(run=rest, step=2).status == UpdateStatus.APPLIED
    rest.refresh_from_db()
    assert rest.status == "succeeded" and rest.summary["training"]["first_step"] == 2
    (last,) = Checkpoint.objects.filter(run=rest)
    assert last.step == 3 and last.parent_id == first_ckpts[-1].id and last.milestone

    weights, optimizer = _state(last, tmp_path)
    expected_weights, expected_optimizer = _state(whole_ckpts[-1], tmp_path)
    assert weights.keys() == expected_weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, expected_weights[name]), name
    moments = optimizer["state"]
    assert moments.keys() == expected_optimizer["state"].keys() and moments
    for index, entry in moments.items():
        assert float(entry["step"]) == 3.0  # Adam's step counter went on from 2
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(entry[key], expected_optimizer["state"][index][key]), (index, key)

    # The same continuation with weights only (a fresh optimizer, the cursor at the start)
    # is a different run: what exact continuation restores matters.
    loose = submit_train(
        org=alice.org, dataset=dataset, model={"checkpoint": first_ckpts[-1].id},
        plan={**plan, "steps": 1, "continuation": "weights_only"}, key="c",
    )  # fmt: skip
    trainer = training_start(run_id=loose.id)
    assert (trainer.step, trainer.dataset_cursor) == (2, 2) and _positions(loose, 2) == [0, 1]
    step_play(run=loose, step=2)
    loose_weights, loose_optimizer = _state(Checkpoint.objects.get(run=loose), tmp_path)
    assert not all(torch.equal(t, expected_weights[n]) for n, t in loose_weights.items())
    assert {float(e["step"]) for e in loose_optimizer["state"].values()} == {1.0}


@pytest.fixture
def continued(alice) -> tuple[Checkpoint, str]:
    """A checkpoint of a finished two-step run on a dataset, and that dataset's reference."""
    dataset = make_dataset_version(org=alice.org, name="refusals", tasks=2)
    run = submit_train(
        org=alice.org, dataset=dataset, model={"route": "qwen3-8b"}, plan={**PLAN, "steps": 1}, key="refusals"
    )
    (checkpoint,) = _train(run, range(1))
    return checkpoint, dataset.reference


def _post(member, *, model: dict, plan: dict, dataset: str, key: str):
    recipe = {"model": model, "engine": {"name": "synth-mini", "version": "1"}}
    profile = make_profile_version(org=member.org, name=f"mini-{key}", recipe=recipe)
    body = {
        "kind": "train",
        "dataset": dataset,
        "actor": {"profile": profile.profile.name, "version": profile.version},
        "plan": plan,
    }
    return member.client.post("/api/runs", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.mark.parametrize(
    ("plan", "field", "says"),
    [
        ({"lora_rank": 8}, "plan.lora_rank", "has LoRA rank 2, not 8"),
        ({"backend": "tinker"}, "plan.backend", "was trained with the local backend"),
        ({"seed": 4}, "plan.seed", "initialised with seed 3"),
        ({"task_names": ["examples/task-0"]}, "plan.task_names", "walks task_names []"),
    ],
)
def test_plan_values_that_contradict_the_saved_state_are_refused(alice, continued, plan, field, says):
    checkpoint, dataset = continued
    resp = _post(alice, model={"checkpoint": checkpoint.id}, plan={"steps": 1, **plan}, dataset=dataset, key="x")
    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    assert error["field"] == field and error["message"].startswith(f"{field}: ") and says in error["message"]


def test_the_same_values_given_explicitly_are_accepted(alice, continued):
    checkpoint, dataset = continued
    plan = {"steps": 1, "lora_rank": 2, "seed": 3, "backend": "local", "continuation": "exact"}
    resp = _post(alice, model={"checkpoint": checkpoint.id}, plan=plan, dataset=dataset, key="same")
    assert resp.status_code == 201, resp.content


def test_exact_continuation_on_another_dataset_is_refused(alice, continued):
    checkpoint, _ = continued
    other = make_dataset_version(org=alice.org, name="other", tasks=2)
    resp = _post(alice, model={"checkpoint": checkpoint.id}, plan={"steps": 1}, dataset=other.reference, key="o")
    assert resp.status_code == 400 and resp.json()["error"]["field"] == "dataset"
    resp = _post(
        alice, model={"checkpoint": checkpoint.id}, plan={"steps": 1, "continuation": "weights_only"},
        dataset=other.reference, key="o2",
    )  # fmt: skip
    assert resp.status_code == 201, resp.content


def test_a_checkpoint_saved_without_a_cursor_continues_only_weights_only_when_asked(alice, continued):
    checkpoint, dataset = continued
    Checkpoint.objects.filter(pk=checkpoint.pk).update(resume={})  # as saved before the cursor was recorded
    resp = _post(alice, model={"checkpoint": checkpoint.id}, plan={"steps": 1}, dataset=dataset, key="old")
    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    assert error["field"] == "plan.continuation" and '"continuation": "weights_only"' in error["message"]

    resp = _post(
        alice, model={"checkpoint": checkpoint.id}, plan={"steps": 1, "continuation": "weights_only"},
        dataset=dataset, key="old-weights",
    )  # fmt: skip
    assert resp.status_code == 201, resp.content
    run_id = resp.json()["id"]
    from apps.runs.dispatch import run_dispatch
    from apps.runs.services import run_schedule

    run_schedule(run_id=run_id)
    run_dispatch(run_id=run_id)
    trainer = training_start(run_id=run_id)
    assert trainer.status == TrainerStatus.SAMPLING
    # Step numbering goes on from the checkpoint; the cursor starts over (its first batch drawn).
    assert (trainer.step, trainer.dataset_cursor, trainer.weights_only_state) == (1, 2, checkpoint.state_path)
    assert _positions(Run.objects.get(pk=run_id), 1) == [0, 1]
    started = RunEvent.objects.get(run_id=run_id, type="training.started").data
    assert started["continuation"] == "weights_only" and started["first_step"] == 1


def test_continuation_is_only_for_checkpoints_and_a_changed_base_model_is_refused(alice, continued):
    checkpoint, dataset = continued
    resp = _post(
        alice, model={"route": "qwen3-8b"}, plan={"steps": 1, "continuation": "exact"}, dataset=dataset, key="r"
    )
    assert resp.status_code == 400 and resp.json()["error"]["field"] == "plan.continuation"

    Checkpoint.objects.filter(pk=checkpoint.pk).update(state_path="")
    resp = _post(alice, model={"checkpoint": checkpoint.id}, plan={"steps": 1}, dataset=dataset, key="s")
    assert resp.status_code == 400 and resp.json()["error"]["field"] == "actor.model.checkpoint"
    assert "no saved trainer state" in resp.json()["error"]["message"]

    Checkpoint.objects.filter(pk=checkpoint.pk).update(state_path=checkpoint.state_path, base_model="qwen3-32b")
    resp = _post(alice, model={"checkpoint": checkpoint.id}, plan={"steps": 1}, dataset=dataset, key="b")
    assert resp.status_code == 400 and resp.json()["error"]["field"] == "actor.model.checkpoint"
    assert "adapts the base model 'qwen3-32b'" in resp.json()["error"]["message"]
    assert ModelRoute.objects.filter(name=checkpoint.route).exists()
