"""The grouped pipeline: each group of a batch gives its update what it can as soon as it
settles, while slower groups of the same batch still sample.

Whenever a group of a train run settles, ``contribution_prepare`` (evidence queue) records
its contribution: its evidence published and qualified, the plan's eligibility,
group-centred advantages, its datums, stored packed; or why it is excluded, staleness
included. ``step_feed`` (training queue) records the contribution of any settled group of
the step still without one and, when the step is the one being gathered, submits their
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
from apps.objects.services import object_put, object_read
from apps.runs.models import GroupStatus, SamplingGroup
from apps.training.clients import LiveClient, client_forget, client_lock, live_client
from apps.training.datums import (
    DATUMS_CONTENT_TYPE,
    GroupData,
    datums_pack,
    datums_to_tinker,
    datums_unpack,
    group_prepare,
)
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
# A group found without a contribution at this many of those looks is recorded by the feeder
# itself while the call runs: the process where it settled has not (a backlog, or none).
FEED_UNPREPARED_LOOKS = 3


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


def contribution_record(
    *, update: LearningUpdate, group: SamplingGroup, plan: dict[str, Any], store: bool = False
) -> Recorded:
    """Record what a settled group gives ``update`` (once: a second call returns the first's).
    Callers pass a group they found without a contribution, so none is looked for first:
    this runs on the trainer's path once per group, and a group recorded meanwhile by
    another process is found by its insert failing. With ``store`` (a process other than
    the trainer's) the datums are stored packed for the trainer to read.

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
        if store and data.datums:
            # Content-addressed and create-only: a contribution recorded meanwhile by another
            # process leaves at most an unreferenced copy of the same bytes.
            values["datums_object"] = object_put(
                org=group.run.org, data=datums_pack(data.datums), content_type=DATUMS_CONTENT_TYPE
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
    recorded = {
        c.group_id: c
        for c in GroupContribution.objects.filter(group_id__in=[g.id for g in groups]).select_related("datums_object")
    }
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
    if data is None and (stored := contribution.datums_object) is not None:
        # Prepared where the group settled: one object read, not the group's evidence.
        data = GroupData(group_id=contribution.group_id, attempts=0, datums=datums_unpack(object_read(obj=stored)))
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
    """Queue, with ``submit``, the forward/backward of every included contribution of the
    update's settled groups that the run's live client lacks, and record the contribution of
    those that have none. Submits only to a client holding the weights of the step.

    Contributions are normally recorded where their groups settled (``contribution_prepare``),
    their datums stored packed: this process, which with a local backend is the one driving
    the model, then reads one object per group instead of the group's evidence, and its
    interpreter and CPU stay with the model. It records a group itself when its client has
    nothing queued (the client would idle otherwise), or when the group is still without a
    contribution after FEED_UNPREPARED_LOOKS looks, so nothing waits long on a preparer that
    is slow or gone. The client runs its calls in order on its own thread; while it runs its
    last queued call, this looks now and then for groups recorded meanwhile and queues them
    behind it, so the client does not idle between groups."""
    if not submit:
        contributions_record(update=update, plan=plan)
        return
    settled = SamplingGroup.objects.filter(run_id=update.run_id, step=update.step, status=GroupStatus.SETTLED)
    taken: set[str] = set()  # groups whose contribution this feed has queued, found accumulated or excluded
    unrecorded: list[SamplingGroup] = []  # as of the last look, in position order
    misses: dict[str, int] = {}  # looks at which a group was found without a contribution

    def look() -> list[Recorded]:
        """The included contributions of the settled groups not taken yet, and (kept in
        ``unrecorded``) the groups without one: one query for both, however many groups."""
        unrecorded.clear()
        found: list[Recorded] = []
        for group in (
            settled.exclude(pk__in=taken)
            .select_related("run__spec", "contribution__datums_object")
            .order_by("position")
        ):
            try:
                contribution = group.contribution
            except GroupContribution.DoesNotExist:
                unrecorded.append(group)
                misses[group.id] = misses.get(group.id, 0) + 1
                continue
            taken.add(group.id)
            if contribution.status in INCLUDED:
                found.append(Recorded(contribution=contribution))
        return found

    def record(group: SamplingGroup) -> list[Recorded]:
        unrecorded.remove(group)
        recorded = contribution_record(update=update, group=group, plan=plan)
        taken.add(group.id)
        return [recorded] if recorded.contribution.status in INCLUDED else []

    holder = process_identity()
    with client_lock(trainer.run_id):
        live: LiveClient | None = None
        queued: list[Submission] = []
        wait = FEED_LOOK_FIRST_SECONDS
        pending = look()
        try:
            while True:
                for recorded in pending:
                    live = live or live_client(trainer=trainer, plan=plan)
                    if live.step != update.step:
                        submit = False  # its update submits them instead
                    if submit and (submission := submission_start(live=live, recorded=recorded, plan=plan)):
                        queued.append(submission)
                pending = []
                if queued:
                    assert live is not None  # queued on it
                    if len(queued) == 1 and not _done_within(future=queued[0].future, seconds=wait):
                        # The client runs its last queued call: queue behind it what was
                        # recorded meanwhile, looking less often the longer the call runs.
                        wait = min(wait * 2, FEED_LOOK_MOST_SECONDS)
                        pending = look()
                        late = [g for g in unrecorded if misses[g.id] >= FEED_UNPREPARED_LOOKS]
                        if late and not pending:
                            pending = record(late[0])
                        continue
                    wait = FEED_LOOK_FIRST_SECONDS
                    submission_finish(live=live, submission=queued.pop(0), holder=holder)
                    if not queued:  # what settled or was recorded during that call
                        pending = look()
                elif unrecorded:
                    # Nothing queued: recording the group here costs the client nothing.
                    pending = record(unrecorded[0])
                elif not (pending := look()) and not unrecorded:
                    break
        except Exception:
            # Some of a failed call's gradients may have accumulated: the client is unknown now.
            client_forget(trainer.run_id)
            raise


def _update_gathering(*, run_id: str, step: int) -> LearningUpdate | None:
    """The step's learning update (made if missing, sampling the weights its first group
    sampled) while it still gathers its groups; None once it has moved on."""
    sampler = (
        SamplingGroup.objects.filter(run_id=run_id, step=step).order_by("position").values_list("sampler", flat=True)
    ).first()
    if sampler is None:
        return None
    update, _ = LearningUpdate.objects.get_or_create(run_id=run_id, step=step, defaults={"sampler": sampler})
    return update if update.status == UpdateStatus.PENDING else None


def contribution_prepare(*, run_id: str, group_id: str) -> bool:
    """A group of a train run settled: record its contribution here, on the evidence queue,
    with its datums stored packed, so that the training process finds it recorded and reads
    one object instead of the group's evidence (``contributions_feed``). True if it built
    the group's datums here. Idempotent, and nothing depends on it: the training process
    records a group it finds without a contribution itself, and a failure here is logged
    and left to it."""
    group = (
        SamplingGroup.objects.select_related("run__spec", "run__org")
        .filter(pk=group_id, run_id=run_id, status=GroupStatus.SETTLED, contribution__isnull=True)
        .first()
    )
    if group is None or group.run.is_terminal:
        return False
    trainer = Trainer.objects.filter(run_id=run_id).only("status", "step").first()
    if trainer is None or trainer.status not in (TrainerStatus.SAMPLING, TrainerStatus.UPDATING):
        return False
    if group.step < trainer.step or (update := _update_gathering(run_id=run_id, step=group.step)) is None:
        return False
    try:
        recorded = contribution_record(update=update, group=group, plan=group.run.spec.plan, store=True)
    except Exception:  # noqa: BLE001 - the training process records it instead
        logger.exception("preparing group %s of %s failed; the trainer will record it", group_id, run_id)
        return False
    return recorded.data is not None


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
    update = _update_gathering(run_id=run_id, step=step)
    if update is None:
        return False
    try:
        contributions_feed(
            trainer=trainer,
            update=update,
            plan=trainer.run.spec.plan,
            submit=submit and trainer.step == step and trainer.status == TrainerStatus.SAMPLING,
        )
    except Exception:  # noqa: BLE001 - the update gathers and submits again, and fails the run if it must
        logger.exception("feeding step %s of %s failed; its update will do the work", step, run_id)
    return step_settled(run_id=run_id, step=step)
