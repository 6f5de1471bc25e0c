"""The grouped pipeline: each group of a batch gives its update what it can as soon as it
settles, while slower groups of the same batch still sample.

``step_feed`` runs (training queue) whenever a group of a train run settles: it records the
contribution of every settled group of the step that has none yet (its evidence published
and qualified, the plan's eligibility, group-centred advantages, its datums; or why it is
excluded, staleness included) and, when the step is the one being gathered, submits their
forward/backward to the run's training client, where gradients accumulate until the
optimizer step. Then it moves the trainer to ``updating`` once every group has settled, and
the update (apps.training.updates) submits whatever its own client has not accumulated,
steps the optimizer and saves the weights the next batch samples.

Nothing here needs the same process to see a step through: a contribution's forward/backward
counts only in the client that ran it (its key, one per group per update, is kept with the
client's gradients), and the process that takes the optimizer step submits every included
contribution its client lacks. A worker that died mid-batch loses only work that is done
again; none is counted twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.core.process import process_identity
from apps.runs.models import GroupStatus, SamplingGroup
from apps.training.clients import LiveClient, client_forget, client_lock, live_client
from apps.training.datums import GroupData, datums_to_tinker, group_prepare
from apps.training.evidence import group_attempts, group_summary
from apps.training.models import (
    ContributionStatus,
    GroupContribution,
    LearningUpdate,
    Trainer,
    TrainerStatus,
    UpdateStatus,
)

logger = logging.getLogger(__name__)

INCLUDED = (ContributionStatus.READY, ContributionStatus.SUBMITTED)
# While the client runs its last queued forward/backward, the feeder looks again for a group
# that settled meanwhile after this long, doubling up to the most: a local call (a fraction
# of a second) gets a few looks, a remote one (seconds) a few more, never one per tick.
FEED_LOOK_FIRST_SECONDS = 0.01
FEED_LOOK_MOST_SECONDS = 0.5


@dataclass
class Recorded:
    """A contribution and, when this process prepared it, its datums (else built again)."""

    contribution: GroupContribution
    data: GroupData | None = None


def _prepare(*, group: SamplingGroup, plan: dict[str, Any]) -> GroupData:
    eligibility = plan.get("eligibility") or {}
    return group_prepare(
        group_id=group.id,
        attempts=group_attempts(group=group),
        min_valid=int(eligibility.get("min_valid_per_group", 2)),
        require_variance=bool(eligibility.get("require_reward_variance", True)),
    )


def contribution_record(*, update: LearningUpdate, group: SamplingGroup, plan: dict[str, Any]) -> Recorded:
    """Record what a settled group gives ``update`` (once: a second call returns the first's).
    Callers pass a group they found without a contribution, so none is looked for first:
    this runs on the trainer's path once per group, and a group recorded meanwhile by
    another process is found by its insert failing.

    Staleness is judged before anything is read: a group sampled more than ``max_staleness``
    steps behind the weights being trained is excluded whatever its rewards."""
    staleness = max(0, update.step - group.sampler_step)
    limit = int(plan.get("max_staleness", 0))
    values: dict[str, Any] = {"update": update, "sampler_step": group.sampler_step, "staleness": staleness}
    data: GroupData | None = None
    if staleness > limit:
        values.update(
            status=ContributionStatus.EXCLUDED,
            reason=f"sampled {staleness} steps behind the trained weights (max_staleness {limit})",
        )
    else:
        data = _prepare(group=group, plan=plan)
        values.update(
            status=ContributionStatus.READY if data.datums else ContributionStatus.EXCLUDED,
            reason=data.skipped,
            summary=group_summary(data),
            datums=len(data.datums),
            sampled_tokens=sum(d.sampled_tokens for d in data.datums),
        )
    try:
        with transaction.atomic():
            contribution = GroupContribution.objects.create(group=group, **values)
    except IntegrityError:  # another process recorded it meanwhile: the same facts
        return Recorded(contribution=GroupContribution.objects.get(group=group))
    return Recorded(contribution=contribution, data=data)


def contributions_record(*, update: LearningUpdate, plan: dict[str, Any]) -> list[Recorded]:
    """Every settled group of the update's step, recorded, in position order.

    The contributions recorded as the groups settled are read in one query, not one per
    group: this runs on the critical path of every optimizer step, and a batch has as many
    groups as its plan's batch_size."""
    groups = list(
        SamplingGroup.objects.filter(run_id=update.run_id, step=update.step, status=GroupStatus.SETTLED)
        .select_related("run__spec")
        .order_by("position")
    )
    recorded = {c.group_id: c for c in GroupContribution.objects.filter(group_id__in=[g.id for g in groups])}
    return [
        Recorded(contribution=recorded[group.id])
        if group.id in recorded
        else contribution_record(update=update, group=group, plan=plan)
        for group in groups
    ]


def kl_terms(*, datums: list[Any], outputs: list[dict[str, Any]]) -> tuple[float, int]:
    """(sum of sampler logprob - trainer logprob, tokens) over trained tokens: ~0 when the
    proxy sampled exactly the weights the trainer holds (on-policy)."""
    total, count = 0.0, 0
    # As arrays, not a loop over every token: this runs once per group on the trainer's
    # path, and with a local backend its interpreter is the one driving the model.
    for datum, output in zip(datums, outputs, strict=True):
        trained = numpy.asarray(datum.advantages, dtype=numpy.float64) != 0.0
        sampler = numpy.asarray(datum.logprobs, dtype=numpy.float64)[trained]
        trainer = output["logprobs"].to_numpy().astype(numpy.float64)[: len(trained)][trained]
        total += float((sampler - trainer).sum())
        count += int(trained.sum())
    return total, count


@dataclass
class Submission:
    """A contribution's forward/backward queued on a live client, not yet waited for."""

    recorded: Recorded
    data: GroupData
    future: Any


def submission_start(*, live: LiveClient, recorded: Recorded, plan: dict[str, Any]) -> Submission | None:
    """Queue the contribution's forward/backward on ``live`` unless it has accumulated it
    already (caller holds the run's client lock, and forgets the client if this or the
    wait raises). The client runs its calls in order on its own thread."""
    contribution = recorded.contribution
    if contribution.key in live.keys:
        return None
    data = recorded.data
    if data is None:  # prepared by another process: the same evidence gives the same datums
        data = _prepare(
            group=SamplingGroup.objects.select_related("run__spec").get(pk=contribution.group_id), plan=plan
        )
    if not data.datums:
        raise RuntimeError(f"group {contribution.group_id} no longer gives the datums it was recorded with")
    future = live.client.forward_backward(datums_to_tinker(data.datums), plan.get("loss", "importance_sampling"))
    return Submission(recorded=recorded, data=data, future=future)


def submission_finish(*, live: LiveClient, submission: Submission, holder: str) -> None:
    """Wait for a queued forward/backward and record it as accumulated in ``live``."""
    out = submission.future.result()
    contribution = submission.recorded.contribution
    live.keys.add(contribution.key)
    kl_sum, kl_tokens = kl_terms(datums=submission.data.datums, outputs=out.loss_fn_outputs)
    metrics = {"loss": out.metrics.get("loss:sum"), "kl_sum": kl_sum, "kl_tokens": kl_tokens}
    GroupContribution.objects.filter(pk=contribution.pk, status__in=INCLUDED).update(
        status=ContributionStatus.SUBMITTED, holder=holder, metrics=metrics, submitted_at=timezone.now()
    )
    contribution.status, contribution.holder, contribution.metrics = ContributionStatus.SUBMITTED, holder, metrics


def _done_within(*, future: Any, seconds: float) -> bool:
    """Whether a backend call's future is done within ``seconds`` (its error, if it failed,
    is raised by whoever takes its result)."""
    try:
        future.result(timeout=seconds)
    except TimeoutError:
        return False
    except Exception:  # noqa: BLE001 - done, with an error: submission_finish raises it
        return True
    return True


def contribution_submit(*, live: LiveClient, recorded: Recorded, plan: dict[str, Any], holder: str) -> bool:
    """Run the contribution's forward/backward on ``live`` unless it has accumulated it
    already (caller holds the run's client lock, and forgets the client if this raises).
    True if it ran now."""
    submission = submission_start(live=live, recorded=recorded, plan=plan)
    if submission is None:
        return False
    submission_finish(live=live, submission=submission, holder=holder)
    return True


def contributions_feed(*, trainer: Trainer, update: LearningUpdate, plan: dict[str, Any], submit: bool) -> None:
    """Record the contribution of every settled group of the update's step that has none,
    and, with ``submit``, queue the forward/backward of each included contribution the run's
    live client lacks as soon as it is recorded. The client runs its calls in order on its
    own thread, so the next group's evidence is read and its datums built while the one
    before trains; when no settled group is left to record this waits for the oldest call.
    It looks for groups that settled meanwhile only while the client has at most one call
    queued (then now and then while that last call runs), so that the client never idles
    while a group's datums are built after its call. Submits only to a client holding the
    weights of the step."""
    settled = SamplingGroup.objects.filter(run_id=update.run_id, step=update.step, status=GroupStatus.SETTLED)
    # The settled groups without a contribution, read together and taken in turn. Every
    # query is CPU of this process, which with a local backend is the one driving the model
    # being trained: a batch's groups are read as often for a large batch as for a small one.
    unrecorded: list[SamplingGroup] = []

    def next_unrecorded(*, look: bool) -> SamplingGroup | None:
        if not unrecorded and look:
            unrecorded.extend(
                settled.filter(contribution__isnull=True).select_related("run__spec").order_by("-position")
            )
        return unrecorded.pop() if unrecorded else None

    if not submit:
        contributions_record(update=update, plan=plan)
        return
    holder = process_identity()
    with client_lock(trainer.run_id):
        live: LiveClient | None = None
        queued: list[Submission] = []
        look = FEED_LOOK_FIRST_SECONDS
        # Those recorded before (a call that could not submit, another process' client) first.
        pending = [
            Recorded(contribution=c)
            for c in GroupContribution.objects.filter(update=update, status__in=INCLUDED).order_by("group__position")
        ]
        try:
            while True:
                for recorded in pending:
                    live = live or live_client(trainer=trainer, plan=plan)
                    if live.step != update.step:
                        submit = False  # its update submits them instead
                    if submit and (submission := submission_start(live=live, recorded=recorded, plan=plan)):
                        queued.append(submission)
                group = next_unrecorded(look=len(queued) <= 1)
                if group is not None:
                    recorded = contribution_record(update=update, group=group, plan=plan)
                    pending = [recorded] if recorded.contribution.status in INCLUDED else []
                elif queued:
                    assert live is not None  # queued on it
                    pending = []
                    if len(queued) == 1 and not _done_within(future=queued[0].future, seconds=look):
                        # The client runs its last queued call: a group that settles meanwhile
                        # is recorded and queued behind it, so the client does not idle while
                        # that group's evidence is read and its datums built after the call.
                        look = min(look * 2, FEED_LOOK_MOST_SECONDS)
                        continue
                    look = FEED_LOOK_FIRST_SECONDS
                    submission_finish(live=live, submission=queued.pop(0), holder=holder)
                else:
                    break
        except Exception:
            # Some of a failed call's gradients may have accumulated: the client is unknown now.
            client_forget(trainer.run_id)
            raise


def step_feed(*, run_id: str, step: int, submit: bool = True) -> bool:
    """A group of ``step`` settled: record the contributions of its settled groups, submit
    them if the step is being gathered (``submit``), and move the trainer to updating when
    the whole batch has settled. Idempotent. True if this call moved the trainer."""
    from apps.training.services import step_settled

    trainer = Trainer.objects.select_related("run__spec").filter(run_id=run_id).first()
    if trainer is None or trainer.status not in (TrainerStatus.SAMPLING, TrainerStatus.UPDATING):
        return False
    if step < trainer.step or trainer.run.is_terminal:
        return step_settled(run_id=run_id, step=step)  # ends the learner of a cancelled run
    plan = trainer.run.spec.plan
    sampler = (
        SamplingGroup.objects.filter(run_id=run_id, step=step).order_by("position").values_list("sampler", flat=True)
    ).first()
    if sampler is None:
        return False
    update, _ = LearningUpdate.objects.get_or_create(run_id=run_id, step=step, defaults={"sampler": sampler})
    if update.status != UpdateStatus.PENDING:
        return False
    try:
        contributions_feed(
            trainer=trainer,
            update=update,
            plan=plan,
            submit=submit and trainer.step == step and trainer.status == TrainerStatus.SAMPLING,
        )
    except Exception:  # noqa: BLE001 - the update gathers and submits again, and fails the run if it must
        logger.exception("feeding step %s of %s failed; its update will do the work", step, run_id)
    return step_settled(run_id=run_id, step=step)
