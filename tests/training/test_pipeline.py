"""The grouped pipeline through the real services and the local backend: attempts sample
their group's binding with the proxy's local sampler (tiny model, checkpoints' adapters
from the object store), their captures are staged and settled as the proxy does, and the
learner feeds each settled group's forward/backward before the optimizer step.

* the S0 -> S1 boundary (max_staleness 0): no attempt of batch N samples S1, every attempt
  of batch N+1 does;
* max_staleness 1: the next batch samples S0 while the update runs, its kl is reported by
  staleness, and groups more than one step behind are excluded and recorded;
* gradients fed group by group, in any order and delivered twice, give the lockstep update;
* a group prepared where it settled (the evidence queue) stores the datums its evidence
  gives, and the feed trains it from them: a group prepared while a forward/backward runs
  is queued behind it by the same call; one nobody prepares is recorded by the feeder
  while that call still runs;
* kl over trained tokens only (a trainer array longer than the datum tolerated);
* feeding a batch of prepared groups reads none of their evidence, and its groups and
  their contributions as often for five groups as for two;
* the start task's warmed training client is the one the first group trains on;
* a training worker killed mid-batch: the sweeper moves the step on, and its
  forward/backward is done again, once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from django.db import connection
from django.test.utils import CaptureQueriesContext
from tinker.types import TensorData

from apps.accounts.services import org_get_or_create
from apps.core.process import process_identity
from apps.objects.services import object_read
from apps.proxy.models import Interaction
from apps.runs.models import RunEvent, SamplingGroup, Trial
from apps.runs.sweeper import sweep_tick
from apps.training import clients, pipeline
from apps.training.datums import PackedDatum, datums_pack, datums_unpack
from apps.training.models import (
    Checkpoint,
    ContributionStatus,
    GroupContribution,
    LearningUpdate,
    Trainer,
    TrainerStatus,
    UpdateStatus,
)
from apps.training.pipeline import contributions_record, step_feed
from apps.training.services import step_settled, training_start
from apps.training.updates import update_apply
from bench.training_pipeline import Attempts, adapter_weights
from tests.factories import make_train_run

ROOT = Path(__file__).resolve().parents[2]
PLAN = {"batch_size": 3, "group_size": 2, "learning_rate": 0.01, "lora_rank": 4, "max_concurrency": 100}


@pytest.fixture
def attempts() -> Attempts:
    return Attempts(prompt_tokens=40, max_tokens=12)


def _train_run(slug: str, **plan):
    return make_train_run(org=org_get_or_create(slug=slug), tasks=3, **{**PLAN, **plan})


def _attempt_all(attempts: Attempts, run, step: int, *, positions: list[int] | None = None, feed: bool = True) -> None:
    """Run the step's attempts group by group (in ``positions`` order), feeding the
    learner as each group settles, as the training queue does on group.settled."""
    groups = {g.position: g for g in SamplingGroup.objects.filter(run=run, step=step)}
    for position in positions if positions is not None else sorted(groups):
        for trial in Trial.objects.filter(group=groups[position]).order_by("attempt"):
            attempts.run(trial_id=trial.id)
        if feed:
            step_feed(run_id=run.id, step=step)


def _update(run, step: int) -> LearningUpdate:
    trainer = Trainer.objects.get(run=run)
    assert trainer.status == TrainerStatus.UPDATING and trainer.step == step
    update = update_apply(run_id=run.id, step=step)
    assert update is not None
    update.refresh_from_db()
    return update


def _served(run, step: int) -> list[Interaction]:
    trials = Trial.objects.filter(run=run, group__step=step).values_list("id", flat=True)
    return list(Interaction.objects.filter(trial_id__in=list(trials)))


def _weights_close(a: Checkpoint, b: Checkpoint) -> float:
    wa, wb = adapter_weights(a), adapter_weights(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


@pytest.mark.django_db
def test_the_boundary_batch_n_samples_s0_and_batch_n_plus_1_samples_s1(attempts):
    run = _train_run("boundary", steps=2)
    training_start(run_id=run.id)
    _attempt_all(attempts, run, 0)
    # Every group's forward/backward ran as it settled: the update only steps the optimizer.
    assert not SamplingGroup.objects.filter(run=run, step=1).exists()
    contributions = list(GroupContribution.objects.filter(update__run=run, update__step=0))
    assert len(contributions) == 3 and all(c.status == ContributionStatus.SUBMITTED for c in contributions)
    assert {c.holder for c in contributions} == {process_identity()}
    update0 = _update(run, 0)
    assert update0.status == UpdateStatus.APPLIED and update0.metrics["groups_submitted_late"] == 0
    assert abs(update0.metrics["kl_sample_train"]) < 1e-3
    s1 = update0.checkpoint

    groups1 = list(SamplingGroup.objects.filter(run=run, step=1))
    assert groups1 and all(g.sampler == s1.binding() and g.sampler_step == 1 for g in groups1)
    _attempt_all(attempts, run, 1)
    update1 = _update(run, 1)
    assert update1.status == UpdateStatus.APPLIED
    # On-policy at S1 too: the proxy served the checkpoint the trainer holds.
    assert abs(update1.metrics["kl_sample_train"]) < 1e-3 and update1.metrics["staleness_max"] == 0

    step0, step1 = _served(run, 0), _served(run, 1)
    assert len(step0) == 6 and all(i.snapshot.get("adapter") is None for i in step0)
    assert len(step1) == 6 and all(i.snapshot["adapter_dir"].endswith(s1.sha256) for i in step1)
    events = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", "data"))
    applied = next(i for i, (t, d) in enumerate(events) if t == "training.update_applied" and d["step"] == 0)
    started = next(i for i, (t, d) in enumerate(events) if t == "batch.started" and d["step"] == 1)
    assert applied < started
    # Lineage: which groups went into which update.
    assert {c.group_id for c in LearningUpdate.objects.get(pk=update1.pk).contributions.all()} == {
        g.id for g in groups1
    }


@pytest.mark.django_db
def test_staleness_one_samples_s0_during_the_update_and_excludes_groups_further_behind(attempts):
    run = _train_run("stale", steps=3, max_staleness=1)
    training_start(run_id=run.id)
    _attempt_all(attempts, run, 0)
    # The batch of step 1 started when step 0's batch was complete, on S0, before update 0.
    assert LearningUpdate.objects.get(run=run, step=0).status == UpdateStatus.PENDING
    early = list(SamplingGroup.objects.filter(run=run, step=1))
    assert len(early) == 3 and all(g.sampler == {"route": "qwen3-8b"} and g.sampler_step == 0 for g in early)
    _attempt_all(attempts, run, 1)  # they sample while update 0 has not been applied
    assert not GroupContribution.objects.filter(group__in=early, status=ContributionStatus.SUBMITTED).exists()
    update0 = _update(run, 0)
    assert update0.status == UpdateStatus.APPLIED
    s1 = update0.checkpoint

    step_feed(run_id=run.id, step=1)  # the feed _advance enqueues for a batch started early
    trainer = Trainer.objects.get(run=run)
    assert trainer.step == 1 and trainer.status == TrainerStatus.UPDATING
    # Update 1 is running: step 2's batch samples S1 meanwhile.
    groups2 = list(SamplingGroup.objects.filter(run=run, step=2))
    assert groups2 and all(g.sampler == s1.binding() and g.sampler_step == 1 for g in groups2)
    update1 = _update(run, 1)
    assert update1.status == UpdateStatus.APPLIED and update1.metrics["staleness_max"] == 1
    by_staleness = update1.metrics["kl_sample_train_by_staleness"]
    assert list(by_staleness) == ["1"] and by_staleness["1"] != 0.0  # S0's logprobs, trained at S1
    assert all(g["staleness"] == 1 and g["sampler_step"] == 0 for g in update1.groups)
    served1 = _served(run, 1)
    assert served1 and all(i.snapshot.get("adapter") is None for i in served1)

    # A batch left two steps behind (as after a recovery that bound it to S0): excluded.
    SamplingGroup.objects.filter(run=run, step=2).update(sampler={"route": "qwen3-8b"}, sampler_step=0)
    _attempt_all(attempts, run, 2)
    update2 = _update(run, 2)
    assert update2.status == UpdateStatus.SKIPPED and update2.metrics["groups_stale"] == 3
    assert {g["skipped"] for g in update2.groups} == {"sampled 2 steps behind the trained weights (max_staleness 1)"}
    assert all(g["staleness"] == 2 for g in update2.groups)
    run.refresh_from_db()
    assert run.status == "succeeded" and run.summary["training"]["steps"] == 3


@pytest.mark.django_db
def test_groups_fed_in_any_order_and_twice_give_the_lockstep_update(attempts):
    lockstep = _train_run("lockstep", steps=1)
    training_start(run_id=lockstep.id)
    _attempt_all(attempts, lockstep, 0, feed=False)
    assert step_settled(run_id=lockstep.id, step=0)
    expected = _update(lockstep, 0)
    assert expected.metrics["groups_submitted_late"] == 3

    fed = _train_run("fed", steps=1)
    training_start(run_id=fed.id)
    _attempt_all(attempts, fed, 0, positions=[2, 0, 1])
    step_feed(run_id=fed.id, step=0)  # a second delivery of the last group's message
    update = _update(fed, 0)
    assert update.metrics["groups_submitted_late"] == 0
    assert update.metrics["loss_sum"] == pytest.approx(expected.metrics["loss_sum"], rel=1e-5)
    # Same weights, within float summation order: the gradients were summed in another order,
    # and AdamW's first step, g / (|g| + eps), amplifies that where |g| is near eps. Far
    # under the learning rate (0.01), by which the update moved every other weight.
    assert _weights_close(update.checkpoint, expected.checkpoint) < 1e-4
    assert max(float(t.abs().max()) for t in adapter_weights(update.checkpoint).values()) > 1e-3


@pytest.mark.django_db
def test_the_update_reads_the_contributions_recorded_as_groups_settled_in_one_query(attempts):
    run = _train_run("pipe-gather", batch_size=3)
    training_start(run_id=run.id)
    _attempt_all(attempts, run, 0, feed=False)
    update, _ = LearningUpdate.objects.get_or_create(run=run, step=0, defaults={"sampler": {}})
    plan = run.spec.plan
    first = contributions_record(update=update, plan=plan)  # records the three groups
    assert [r.contribution.group.position for r in first] == [0, 1, 2]
    with CaptureQueriesContext(connection) as queries:
        again = contributions_record(update=update, plan=plan)
    # The settled groups and their contributions: two queries whatever the batch size.
    assert len(queries) == 2
    assert [r.contribution.pk for r in again] == [r.contribution.pk for r in first]
    assert all(r.data is None for r in again)  # recorded before: datums built again only if submitted


def test_kl_terms_sum_the_sampler_minus_trainer_logprobs_over_trained_tokens_only():
    datums = [
        PackedDatum(
            trial_id="t",
            input_ids=[1, 2, 3, 4],
            target_ids=[2, 3, 4, 5],
            logprobs=[0.0, -0.5, -1.25, -2.0],
            advantages=[0.0, 0.5, -0.5, 0.0],
            mask=[0.0, 1.0, 1.0, 1.0],
        ),
        PackedDatum(trial_id="u", input_ids=[1], target_ids=[2], logprobs=[-3.0], advantages=[0.25], mask=[1.0]),
    ]
    outputs = [
        # A trainer's array may be longer than the datum: only the datum's positions count.
        {"logprobs": TensorData(data=[-9.0, -0.75, -1.0, -9.0, -9.0], dtype="float32", shape=[5])},
        {"logprobs": TensorData(data=[-2.5], dtype="float32", shape=[1])},
    ]
    total, count = pipeline.kl_terms(datums=datums, outputs=outputs)
    assert count == 3
    assert total == pytest.approx((-0.5 + 0.75) + (-1.25 + 1.0) + (-3.0 + 2.5))


@pytest.mark.django_db
def test_a_group_prepared_where_it_settled_stores_the_datums_its_evidence_gives(attempts):
    run = _train_run("prepare")
    training_start(run_id=run.id)
    _attempt_all(attempts, run, 0, positions=[0], feed=False)
    group = SamplingGroup.objects.select_related("run__spec").get(run=run, step=0, position=0)
    unsettled = SamplingGroup.objects.get(run=run, step=0, position=1)
    assert not pipeline.contribution_prepare(run_id=run.id, group_id=unsettled.id)  # nothing to prepare yet
    # A learner that stopped (an update left unresolved) takes nothing more.
    Trainer.objects.filter(run=run).update(status=TrainerStatus.BLOCKED)
    assert not pipeline.contribution_prepare(run_id=run.id, group_id=group.id)
    assert not GroupContribution.objects.filter(group=group).exists()
    Trainer.objects.filter(run=run).update(status=TrainerStatus.SAMPLING)
    assert pipeline.contribution_prepare(run_id=run.id, group_id=group.id)
    assert not pipeline.contribution_prepare(run_id=run.id, group_id=group.id)  # once
    contribution = GroupContribution.objects.select_related("datums_object").get(group=group)
    assert contribution.status == ContributionStatus.READY and contribution.datums > 0
    stored = datums_unpack(object_read(obj=contribution.datums_object))
    # The same datums, floats bit for bit, as the training process builds from the evidence.
    assert stored == pipeline._prepare(group=group, plan=run.spec.plan).datums
    assert len(stored) == contribution.datums


def test_packed_datums_read_back_equal_floats_included():
    datums = [
        PackedDatum(
            trial_id="t",
            input_ids=[1, 151_643, 3],
            target_ids=[151_643, 3, 4],
            logprobs=[0.0, -1.0000000000000002e-07, -17.394531250000004],
            advantages=[0.0, 0.3333333333333333, -0.6666666666666667],
            mask=[0.0, 1.0, 1.0],
        )
    ]
    assert datums_unpack(datums_pack(datums)) == datums


def test_preparing_a_contribution_goes_to_the_evidence_queue_and_the_feed_to_the_training_queue():
    from synth_project.celery import app

    route = app.amqp.router.route
    assert route({}, "training.contribution_prepare")["queue"].name == "evidence"
    assert route({}, "training.group_settled")["queue"].name == "training"


@pytest.mark.django_db
def test_feeding_prepared_groups_reads_no_evidence_and_as_much_for_five_groups_as_for_two(attempts, monkeypatch):
    # While the client runs its last call the feeder looks again after a while: here only
    # once that call is done, so the count does not depend on how long the calls take.
    monkeypatch.setattr(pipeline, "FEED_LOOK_FIRST_SECONDS", 600.0)
    reads: dict[int, dict[str, int]] = {}
    for size in (2, 5):
        run = make_train_run(
            org=org_get_or_create(slug=f"feed-reads-{size}"), tasks=size, **{**PLAN, "batch_size": size}
        )
        training_start(run_id=run.id)
        _attempt_all(attempts, run, 0, feed=False)
        for group in SamplingGroup.objects.filter(run=run, step=0):  # the evidence worker's part
            assert pipeline.contribution_prepare(run_id=run.id, group_id=group.id)
        with CaptureQueriesContext(connection) as queries:
            step_feed(run_id=run.id, step=0)
        fed = GroupContribution.objects.filter(update__run=run, status=ContributionStatus.SUBMITTED)
        assert fed.count() == size
        selects = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
        reads[size] = {
            table: sum(f'FROM "{table}"' in sql for sql in selects)
            for table in (
                "runs_samplinggroup",
                "training_groupcontribution",
                "runs_runspec",
                "objects_storedobject",
                "runs_trial",
                "proxy_interaction",
            )
        }
    # The batch's groups, their contributions and their stored datums' references are read
    # as often for 5 groups as for 2, and none of the groups' evidence is.
    assert reads[5] == reads[2], reads
    assert reads[5]["proxy_interaction"] == 0, reads


@contextlib.contextmanager
def _group_0_training(attempts: Attempts, slug: str) -> Iterator[tuple[Any, Any]]:
    """A run whose group 0 a feeding call (a thread) has recorded and queued on the client,
    where its forward/backward waits: the client runs its calls under its own lock, held
    here. Yields (run, live client); the feeding call has ended when this exits."""
    run = _train_run(slug, steps=1)
    training_start(run_id=run.id)
    assert clients.client_warm(run_id=run.id)
    live = clients._clients[run.id]
    _attempt_all(attempts, run, 0, positions=[0], feed=False)
    feeder = threading.Thread(target=step_feed, kwargs={"run_id": run.id, "step": 0})
    with live.client._lock:
        feeder.start()
        while not GroupContribution.objects.filter(group__run=run, group__position=0).exists():
            feeder.join(0.01)
        yield run, live
    feeder.join(60)
    assert not feeder.is_alive()


def _fed_by_one_call(attempts: Attempts, run: Any, live: Any) -> list[GroupContribution]:
    fed = list(GroupContribution.objects.filter(update__run=run).order_by("group__position"))
    assert [(c.group.position, c.status) for c in fed] == [
        (0, ContributionStatus.SUBMITTED),
        (1, ContributionStatus.SUBMITTED),
    ]
    assert live.keys == {c.key for c in fed} and clients._clients[run.id] is live
    # The rest of the batch, then the update: nothing was left for it but its own group.
    _attempt_all(attempts, run, 0, positions=[2])
    assert _update(run, 0).metrics["groups_submitted_late"] == 0
    return fed


@pytest.mark.django_db(transaction=True)
def test_a_group_prepared_while_one_trains_is_queued_behind_it_from_its_stored_datums(attempts):
    with _group_0_training(attempts, "overlap-prepared") as (run, live):
        _attempt_all(attempts, run, 0, positions=[1], feed=False)
        group = SamplingGroup.objects.get(run=run, step=0, position=1)
        assert pipeline.contribution_prepare(run_id=run.id, group_id=group.id)
        # Queued on the client behind group 0's call, which still waits: the client's thread
        # holds that call, its queue the next one.
        waiting = live.client._executor._work_queue
        for _ in range(6000):
            if waiting.qsize() == 1:
                break
            time.sleep(0.01)
        assert waiting.qsize() == 1
    fed = _fed_by_one_call(attempts, run, live)
    # Group 0 was recorded by the feeder (nothing was queued), group 1 where it settled.
    assert [c.datums_object_id is not None for c in fed] == [False, True]


@pytest.mark.django_db(transaction=True)
def test_a_group_nobody_prepares_while_one_trains_is_recorded_by_the_feeder_behind_it(attempts):
    with _group_0_training(attempts, "overlap") as (run, live):
        _attempt_all(attempts, run, 0, positions=[1], feed=False)  # settles meanwhile, not prepared
        # Recorded by the feeder while group 0's call still runs, once no other process has
        # at a few looks: its datums are ready when that call ends.
        for _ in range(6000):
            if GroupContribution.objects.filter(group__run=run, group__position=1).exists():
                break
            time.sleep(0.01)
        assert GroupContribution.objects.filter(group__run=run, group__position=1).exists()
        assert not GroupContribution.objects.filter(group__run=run, status=ContributionStatus.SUBMITTED).exists()
    fed = _fed_by_one_call(attempts, run, live)
    assert [c.datums_object_id for c in fed] == [None, None]


@pytest.mark.django_db
def test_the_warmed_client_is_the_one_the_first_group_trains_on(attempts):
    run = _train_run("warm", steps=1)
    assert not clients.client_warm(run_id=run.id)  # no trainer yet
    training_start(run_id=run.id)
    assert clients.client_warm(run_id=run.id)
    warmed = clients._clients[run.id]
    assert warmed.step == 0 and not warmed.keys
    assert not clients.client_warm(run_id=run.id)  # once
    _attempt_all(attempts, run, 0)
    assert clients._clients[run.id] is warmed and len(warmed.keys) == 3
    update = _update(run, 0)
    assert update.status == UpdateStatus.APPLIED and update.metrics["client_seconds"] is not None
    assert update.metrics["groups_submitted_late"] == 0


# What the training queue does on a group.settled message, in a process of its own; then it waits.
FEEDER = """
import sys, time, django
django.setup()
from apps.core.process import process_identity
from apps.training.pipeline import contributions_record, step_feed
step_feed(run_id=sys.argv[1], step=0)
print(process_identity(), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_batch_has_its_forward_backward_done_again_once(attempts, settings):
    lockstep = _train_run("lockstep-crash", steps=1)
    training_start(run_id=lockstep.id)
    _attempt_all(attempts, lockstep, 0, feed=False)
    assert step_settled(run_id=lockstep.id, step=0)
    expected = _update(lockstep, 0)

    run = _train_run("crash", steps=1)
    training_start(run_id=run.id)
    _attempt_all(attempts, run, 0, positions=[0, 1], feed=False)
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "synth_project.settings",
        "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "SYNTH_VAR_DIR": str(settings.VAR_DIR),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", FEEDER, run.id], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        dead = proc.stdout.readline().strip()
        assert dead, "the feeding process did not start"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    submitted = list(GroupContribution.objects.filter(update__run=run))
    assert len(submitted) == 2 and {(c.status, c.holder) for c in submitted} == {(ContributionStatus.SUBMITTED, dead)}

    # The last group settles and its message is lost too: the sweeper moves the step on,
    # and the update (in this process) does again what died with the feeder, once.
    _attempt_all(attempts, run, 0, positions=[2], feed=False)
    settings.SYNTH_SWEEP_GRACE_SECONDS = 0
    assert sweep_tick().get("steps_settled") == 1
    update = _update(run, 0)
    assert update.status == UpdateStatus.APPLIED and update.metrics["groups_submitted_late"] == 3
    contributions = list(GroupContribution.objects.filter(update=update))
    assert len(contributions) == 3 and {c.holder for c in contributions} == {process_identity()}
    assert update.metrics["loss_sum"] == pytest.approx(expected.metrics["loss_sum"], rel=1e-5)
    assert _weights_close(update.checkpoint, expected.checkpoint) < 1e-6
    assert torch.isfinite(torch.tensor(update.metrics["grad_norm"]))
