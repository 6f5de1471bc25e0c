"""One trial on a trials worker, as a pipeline of small steps: claim the trial's lease,
admit it on this node, open its model access, build what it launches, run Harbor, publish
its files, complete it under the lease.

A step returns what the next one needs, or ends the trial early by raising TrialEnded with
the outcome to record; a lease lost to another holder is StaleLease, and then nothing more
is written. `_attempt_outcome` is the one place where every ending (the attempt's own, a
step's, a platform error) becomes the outcome that `_complete` records.

The database may restart under a running trial. Each database phase starts on a live
connection and retries transient errors for SYNTH_DB_RETRY_SECONDS (apps.core.db): a
finished attempt's result is written until it commits, unless the lease was lost to
another holder (fencing), and what the trial holds (its reservation, its credentials, its
work directory) is given back even when the database is gone.
"""

from __future__ import annotations

import logging
import shutil
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.accounts.models import WorkerIdentity
from apps.core.db import TRANSIENT_DB_ERRORS, db_retry
from apps.core.errors import NotFound, StaleLease
from apps.datasets.services import task_version_materialize
from apps.runs.leases import trial_claim_read, trial_complete, trial_mark_running
from apps.runs.models import Lease, LeaseStatus, Reservation, Trial, TrialStatus, WorkerNode
from apps.runs.settlement import TrialOutcome
from apps.trials.admission import (
    FreedWake,
    Need,
    NeverFits,
    admission_release,
    admission_request,
    admission_try,
    node_current,
    node_usage,
    node_worker,
    trial_need,
)
from apps.trials.harbor_run import harbor_trial_run
from apps.trials.judges import JUDGE_LOGS_DIR, judge_instruction
from apps.trials.launch import actor_recipe, judge_binding, judge_recipe, restore_agent_config, trial_launch_plan
from apps.trials.lease_keeper import LeaseKeeper
from apps.trials.model_access import ModelAccess, ModelAccessError, model_access_close, model_access_open
from apps.trials.publish import artifacts_publish
from apps.trials.workdirs import host_reap, work_dir_make
from synth_sandbox.boundary import task_verifier_fresh

logger = logging.getLogger(__name__)

# The longest a waiting trial sleeps between admission tries: a freed reservation wakes it
# at once (apps.trials.admission.FreedWake); the timeout notices a cancel or a lapsed lease.
ADMISSION_POLL_SECONDS = 0.5


class TrialEnded(Exception):
    """A step ended the trial before its attempt ran to the end; ``outcome`` is what to record."""

    def __init__(self, outcome: TrialOutcome) -> None:
        super().__init__(outcome.error_message or outcome.status)
        self.outcome = outcome


@dataclass
class PlatformFailure(TrialOutcome):
    """The outcome of a trial stopped by the platform (not by the agent or the task)."""


@dataclass
class HeldTrial:
    """A trial this worker holds: under which lease, with what reserved, where it works."""

    worker: WorkerIdentity
    node: WorkerNode
    lease: Lease
    trial: Trial
    keeper: LeaseKeeper
    reservation: Reservation | None = None
    work: Path | None = None

    @property
    def plan(self) -> dict[str, Any]:
        return self.trial.run.spec.plan


@dataclass
class Access:
    """The attempt's model access: the actor's (none for a regrade) and the judge's (if any)."""

    actor: ModelAccess | None = None
    judge: ModelAccess | None = None

    def close(self) -> None:
        for opened in (self.actor, self.judge):
            _access_close(access=opened)


@dataclass
class Launch:
    """What the attempt launches: the actor's launch plan, or a regrade's restore agent
    (``agent_config``, with no launch plan); and the judge's launch plan, if any."""

    launch_plan: Any
    agent_config: Any
    judge_plan: Any


def trial_execute(*, trial_id: str) -> None:
    """Run one trial end to end on this worker. Safe to call twice for the same trial."""
    work_root = Path(settings.SYNTH_WORK_DIR)
    try:
        host_reap(work_root=work_root)  # a killed sibling's sandboxes and work dirs
    except Exception:
        logger.exception("reaping what dead trial processes left failed")
    held = _claim(trial_id=trial_id)
    if held is None:
        return
    held.keeper.start()
    try:
        outcome = _attempt_outcome(held=held, work_root=work_root)
        if outcome is not None:
            _complete(held=held, outcome=outcome)
    finally:
        held.keeper.stop()
        held.keeper.join(timeout=5)
        _reservation_release(held=held)
        if held.work is not None:
            shutil.rmtree(held.work, ignore_errors=True)


def _attempt_outcome(*, held: HeldTrial, work_root: Path) -> TrialOutcome | None:
    """The steps from admission to publication, and the one place where every way they end
    becomes the outcome to record: the attempt's own end, a step's TrialEnded, or a platform
    error (the trial ends with it, visibly). None when nothing may be recorded: the lease was
    lost to another holder (its result is theirs), or the database stayed away longer than
    the retries (the lease lapses and the reaper decides, as for a dead worker)."""
    trial = held.trial
    try:
        work = held.work = work_dir_make(root=work_root, name=f"{trial.id}.{held.lease.fence}")
        need = trial_need(trial=trial, plan=held.plan)
        _admit_and_start(held=held, need=need)
        task_dir = _task_materialize(held=held, dest=work / "task")
        actor, judge = actor_recipe(trial=trial), judge_recipe(trial=trial)
        access = _access_open(held=held, actor=actor, judge=judge)
        try:
            launch = _launch_build(held=held, work=work, task_dir=task_dir, actor=actor, judge=judge, access=access)
            outcome, trial_dir = harbor_trial_run(
                trial=trial,
                task_dir=task_dir,
                trials_dir=work / "trials",
                launch_plan=launch.launch_plan,
                keeper=held.keeper,
                access=access.actor,
                judge_plan=launch.judge_plan,
                judge_access=access.judge,
                agent_config=launch.agent_config,
            )
        finally:
            # The attempt is over (or never started): its credentials must stop working now,
            # not when they expire.
            access.close()
        _still_held(held=held)
        logger.info(
            "trial %s: attempt under lease %s (fence %d) ended %s, rewards %s; recording it",
            trial.id,
            held.lease.id,
            held.lease.fence,
            outcome.status,
            outcome.rewards,
        )
        return _publish(held=held, outcome=outcome, trial_dir=trial_dir, launch_plan=launch.launch_plan)
    except TrialEnded as ended:
        return ended.outcome
    except StaleLease:
        logger.warning("trial %s: lease lost to another holder; its result is theirs", trial.id)
        return None
    except Exception as exc:
        logger.exception("trial %s failed in the platform", trial.id)
        return _platform_failure(held=held, exc=exc)


# --------------------------------------------------------------------------- the steps


def _claim(*, trial_id: str) -> HeldTrial | None:
    """Claim the trial's lease (None when it is settled or held by another)."""
    node = db_retry(write=node_current, what="worker node")
    assert node is not None  # no commit to confirm: db_retry returns what node_current did
    worker = db_retry(write=lambda: node_worker(node=node), what="worker identity")
    assert worker is not None
    # A claim whose commit was not acknowledged looks held on a repeat: the lease then
    # lapses unused and the reaper hands the trial out again.
    # The claim reads what the attempt needs of the trial with it.
    related = (
        "run__org",
        "run__spec__actor_version",
        "run__spec__judge_version",
        "task_version__archive",
        "group__actor",
    )
    claimed = db_retry(
        write=lambda: trial_claim_read(worker=worker, trial_id=trial_id, node_name=node.name, related=related),
        what=f"claim of {trial_id}",
    )
    if claimed is None:
        return None
    lease, trial = claimed
    return HeldTrial(worker=worker, node=node, lease=lease, trial=trial, keeper=LeaseKeeper(worker=worker, lease=lease))


def _still_held(*, held: HeldTrial) -> None:
    if held.keeper.lost.is_set():
        raise StaleLease(f"lease {held.lease.id} was lost")


def _admit_and_start(*, held: HeldTrial, need: Need) -> None:
    """Wait until the node's budget admits the trial, and start it in the grant's
    transaction: a granted slot is never held by a trial that has not started, and the
    start costs no transaction of its own. The trial ends here instead when its need never
    fits or it is cancelled while waiting."""
    node, trial, keeper = held.node, held.trial, held.keeper
    try:
        reservation = db_retry(
            write=lambda: admission_request(node=node, trial=trial, need=need), what=f"admission of {trial.id}"
        )
    except NeverFits as exc:
        raise TrialEnded(
            TrialOutcome(status=TrialStatus.FAILED, error_type="ResourcesExceedBudget", error_message=exc.message)
        ) from exc
    held.reservation = reservation
    waited_since = 0.0
    announced = False
    wake: FreedWake | None = None

    def start(usage: dict[str, float | int]) -> None:
        # The grant's own event first (after a wait: how long, and the node's use with it).
        events: list[tuple[str, dict[str, Any]]] = []
        if wake is not None:
            waited = round(time.monotonic() - waited_since, 3)
            events.append(("admission.granted", {"trial": trial.id, "waited_sec": waited, "usage": usage}))
        trial_mark_running(
            worker=held.worker,
            lease=held.lease,
            trial_id=trial.id,
            data={"task": trial.task_version.name, "attempt": trial.attempt, "node": node.name, "need": need.as_dict()},
            events=events,
            trial=trial,
        )

    def admit() -> bool:
        # Not started when cancelled meanwhile: the trial ends as cancelled while waiting.
        return admission_try(reservation=reservation, on_grant=None if keeper.cancelled.is_set() else start)

    try:
        while not db_retry(write=admit, what=f"admission of {trial.id}"):
            first = wake is None
            if first:
                waited_since = time.monotonic()
                # Listening from here on, the next try sees every release committed before it
                # and the wait after it is ended by any release committed later.
                wake = FreedWake(node_name=node.name)
            elif not announced and time.monotonic() - waited_since >= ADMISSION_POLL_SECONDS:
                # A wait that lasts is announced while it lasts, for whoever watches the run;
                # the common short one (a slot freed while this trial was being claimed) is
                # recorded by its grant alone, without the round trips of a report.
                announced = True
                usage = db_retry(write=lambda: node_usage(node=node), what="node usage")
                keeper.report(
                    {
                        "type": "admission.waiting",
                        "data": {"trial": trial.id, "node": node.name, "need": need.as_dict(), "usage": usage},
                    },
                )
            if keeper.should_stop:
                break
            if not first and wake is not None:
                wake.wait(timeout=ADMISSION_POLL_SECONDS)
    finally:
        if wake is not None:
            wake.close()
    _still_held(held=held)
    if keeper.cancelled.is_set():
        raise TrialEnded(
            TrialOutcome(
                status=TrialStatus.CANCELLED,
                error_type="Cancelled",
                error_message="cancelled while waiting for resources",
            )
        )


def _task_materialize(*, held: HeldTrial, dest: Path) -> Path:
    task_dir = task_version_materialize(task_version=held.trial.task_version, dest=dest)
    if held.plan.get("verifier") == "fresh":
        task_verifier_fresh(task_dir=task_dir)
    return task_dir


def _access_open(*, held: HeldTrial, actor: dict[str, Any], judge: dict[str, Any] | None) -> Access:
    """The actor's model access (a regrade's attempt is over already: none) and the judge's.
    The trial ends here when either cannot be opened."""
    trial = held.trial
    access = Access()
    who = "actor"
    try:
        if trial.source_id is None:
            access.actor = db_retry(
                write=lambda: model_access_open(trial=trial, recipe=actor), what=f"model access of {trial.id}"
            )
        if judge is not None:
            who = "judge"
            access.judge = db_retry(
                write=lambda: model_access_open(
                    trial=trial, recipe=judge, binding=judge_binding(trial=trial), role="judge"
                ),
                what=f"judge model access of {trial.id}",
            )
    except (ModelAccessError, NotFound) as exc:
        # Before any sandbox exists: nothing to clean up, and the message says what to fix.
        access.close()
        raise TrialEnded(
            TrialOutcome(
                status=TrialStatus.FAILED,
                error_type="ModelAccessError",
                error_message=f"judge: {exc.message}" if who == "judge" else exc.message,
            )
        ) from exc
    return access


def _launch_build(
    *,
    held: HeldTrial,
    work: Path,
    task_dir: Path,
    actor: dict[str, Any],
    judge: dict[str, Any] | None,
    access: Access,
) -> Launch:
    """The actor's launch plan (a regrade's restore agent instead) and the judge's, which
    is told where the work to assess is."""
    trial = held.trial
    if trial.source_id is not None:
        launch_plan = None
        agent_config, workdir = db_retry(
            write=lambda: restore_agent_config(trial=trial, task_dir=task_dir, dest=work / "restore"),
            what=f"restore of {trial.id}",
        )
        instruction = trial.task_version.instruction
    else:
        launch_plan = trial_launch_plan(trial=trial, task_dir=task_dir, recipe=actor, access=access.actor)
        agent_config, workdir, instruction = None, launch_plan.workdir, launch_plan.instruction
    judge_plan = None
    if judge is not None:
        judge_plan = trial_launch_plan(
            trial=trial,
            task_dir=task_dir,
            recipe=judge,
            access=access.judge,
            instruction=judge_instruction(instruction=instruction, workdir=workdir),
            logs_dir=JUDGE_LOGS_DIR,
        )
    return Launch(launch_plan=launch_plan, agent_config=agent_config, judge_plan=judge_plan)


def _publish(*, held: HeldTrial, outcome: TrialOutcome, trial_dir: Path, launch_plan: Any) -> TrialOutcome:
    """Publish the trial's files. If that fails for good, the trial fails with the reason
    and keeps its rewards and timings: the attempt's result is not thrown away with them."""
    try:
        db_retry(
            write=lambda: artifacts_publish(trial=held.trial, trial_dir=trial_dir, launch_plan=launch_plan),
            what=f"artifacts of {held.trial.id}",
        )
    except TRANSIENT_DB_ERRORS:
        raise  # the database, not the files: nothing could be recorded either
    except Exception as exc:
        logger.exception("trial %s: publishing its files failed", held.trial.id)
        return replace(
            outcome,
            status=TrialStatus.FAILED,
            error_type=type(exc).__name__,
            error_message=f"publishing the trial's files failed: {exc}",
        )
    return outcome


def _complete(*, held: HeldTrial, outcome: TrialOutcome) -> None:
    """Record the outcome under the lease. When that fails for a reason other than the lease
    or the database, the platform error is recorded instead, with the attempt's rewards and
    timings (once: a platform error that cannot be recorded is logged)."""
    try:
        _record(held=held, outcome=outcome)
    except StaleLease:
        logger.warning("trial %s: lease lost to another holder; its result is theirs", held.trial.id)
    except Exception as exc:
        if isinstance(outcome, PlatformFailure):
            logger.exception("trial %s: recording its platform error failed", held.trial.id)
            return
        logger.exception("trial %s failed in the platform", held.trial.id)
        failure = _platform_failure(held=held, exc=exc, done=outcome)
        if failure is not None:
            _complete(held=held, outcome=failure)


def _record(*, held: HeldTrial, outcome: TrialOutcome) -> None:
    """Write the outcome under the lease until it commits. A repeat after a commit whose
    acknowledgement was lost is recognised by the lease, completed at our fence."""
    lease = held.lease
    db_retry(
        write=lambda: trial_complete(
            worker=held.worker, lease=lease, trial_id=held.trial.id, outcome=outcome, trial=held.trial
        ),
        what=f"result of {held.trial.id}",
        committed=lambda: Lease.objects.filter(pk=lease.id, fence=lease.fence, status=LeaseStatus.COMPLETED).exists(),
    )
    # The completion released the lease's reservations in its transaction: nothing is left
    # for the clean-up to give back (it would lock the run only to find that out).
    held.reservation = None


# --------------------------------------------------------------------------- endings and clean-up


def _platform_failure(*, held: HeldTrial, exc: Exception, done: TrialOutcome | None = None) -> PlatformFailure | None:
    """The platform error that stopped the trial as its outcome (with the rewards and
    timings of ``done``, the attempt's own outcome, if it had finished). Call it while
    handling ``exc``: its traceback goes into the message. None when the database stayed
    unavailable: nothing can be written then."""
    if isinstance(exc, TRANSIENT_DB_ERRORS):
        logger.error("trial %s: the database stayed unavailable; its lease will lapse", held.trial.id)
        return None
    return PlatformFailure(
        status=TrialStatus.FAILED,
        rewards=done.rewards if done else None,
        error_type=type(exc).__name__,
        error_message=f"{exc}\n{traceback.format_exc(limit=5)}",
        timings=done.timings if done else {},
    )


def _access_close(*, access: ModelAccess | None) -> None:
    if access is None:
        return
    try:
        db_retry(write=lambda: model_access_close(access=access), what="credential revocation")
    except Exception:  # it still expires on its own; the trial's result matters more
        logger.exception("revoking credential %s failed", access.credential.pk)


def _reservation_release(*, held: HeldTrial) -> None:
    """Give the node's resources back, whatever happened to the trial or the database."""
    reservation = held.reservation
    if reservation is None:
        return
    try:
        db_retry(
            write=lambda: admission_release(reservation=reservation), what=f"release of {held.trial.id}'s resources"
        )
    except Exception:
        logger.exception("releasing the reservation of trial %s failed", held.trial.id)
