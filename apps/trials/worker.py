"""One trial on a trials worker: lease, admission, a Harbor trial in the sandbox,
artifacts to the object store, completion under the lease.

A keeper thread heartbeats the lease; it is also how cancellation reaches a running
trial (the heartbeat answers `cancel_requested`) and how a worker learns it lost the
trial to another (a stale lease): then it stops without writing anything more.

The database may restart under a running trial. Each database phase starts on a live
connection and retries transient errors for SYNTH_DB_RETRY_SECONDS (apps.core.db): a
finished attempt's result is written until it commits, unless the lease was lost to
another holder (fencing), and what the trial holds (its reservation, its credentials, its
work directory) is given back even when the database is gone.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connections

from apps.accounts.models import WorkerIdentity
from apps.accounts.services import worker_get_or_create
from apps.core.canonical import canonical_bytes
from apps.core.db import TRANSIENT_DB_ERRORS, db_fresh, db_retry
from apps.core.errors import NotFound, StaleLease
from apps.datasets.services import task_version_materialize
from apps.objects.services import object_put
from apps.runs.evaluation import VERIFIER_ERROR
from apps.runs.leases import lease_heartbeat, lease_report, trial_claim, trial_complete, trial_mark_running
from apps.runs.models import Artifact, Lease, LeaseStatus, Reservation, RunKind, Trial, TrialStatus, WorkerNode
from apps.runs.settlement import TrialOutcome
from apps.trials.admission import (
    Budget,
    Need,
    NeverFits,
    admission_release,
    admission_request,
    admission_try,
    node_register,
    node_usage,
)
from apps.trials.judges import JUDGE_LOGS_DIR, judge_instruction
from apps.trials.model_access import (
    ModelAccess,
    ModelAccessError,
    environment_import_path,
    model_access_close,
    model_access_open,
    sandbox_model_options,
)
from apps.trials.workdirs import host_reap, work_dir_make
from synth_sandbox.boundary import task_verifier_fresh, trial_boundary_install

logger = logging.getLogger(__name__)

ADMISSION_POLL_SECONDS = 0.5
# After a failed heartbeat, the next one comes this soon (on a new connection), not a
# whole interval later: a restarted database is back within a second or two.
HEARTBEAT_RETRY_SECONDS = 0.25


class LeaseKeeper(threading.Thread):
    """Heartbeats a lease until stopped; records cancellation and loss. Only a stale
    lease stops it: a database that is down or restarting is beaten again until it is back."""

    def __init__(self, *, worker: WorkerIdentity, lease: Lease) -> None:
        super().__init__(name=f"lease-{lease.id}", daemon=True)
        self.worker = worker
        self.lease = lease
        # Frequent enough that a cancel reaches a running trial within seconds.
        self.interval = max(0.2, min(settings.SYNTH_LEASE_TTL_SECONDS / 3, 2.0))
        self.cancelled = threading.Event()
        self.lost = threading.Event()
        self._halt = threading.Event()
        self._seq = 0
        self._seq_lock = threading.Lock()

    @property
    def should_stop(self) -> bool:
        return self.cancelled.is_set() or self.lost.is_set()

    def next_seq(self) -> int:
        with self._seq_lock:
            self._seq += 1
            return self._seq

    def run(self) -> None:
        try:
            wait = self.interval
            while not self._halt.wait(wait):
                wait = self.interval if self._beat() else min(self.interval, HEARTBEAT_RETRY_SECONDS)
                if self.lost.is_set():
                    return
        finally:
            connections.close_all()

    def _beat(self) -> bool:
        """One heartbeat; False when it did not reach the database."""
        try:
            db_fresh()
            result = lease_heartbeat(worker=self.worker, lease_id=self.lease.id, fence=self.lease.fence)
        except StaleLease:
            logger.warning("lease %s is stale; stopping trial work", self.lease.id)
            self.lost.set()
            return True
        except TRANSIENT_DB_ERRORS as exc:
            logger.warning("heartbeat of %s: database unavailable (%s); beating again", self.lease.id, exc)
            return False
        except Exception:  # anything else: try again next beat, the TTL covers a few misses
            logger.exception("heartbeat of %s failed", self.lease.id)
            return False
        if result.cancel_requested:
            self.cancelled.set()
        return True

    def stop(self) -> None:
        self._halt.set()


def node_current() -> WorkerNode:
    return node_register(
        name=settings.SYNTH_WORKER_NAME,
        budget=Budget(
            slots=settings.SYNTH_WORKER_SLOTS,
            cpus=settings.SYNTH_WORKER_CPUS,
            memory_mb=settings.SYNTH_WORKER_MEMORY_MB,
            storage_mb=settings.SYNTH_WORKER_STORAGE_MB,
        ),
    )


def trial_need(*, trial: Trial, plan: dict[str, Any]) -> Need:
    overrides = plan.get("resources") or {}
    tv = trial.task_version
    return Need(
        cpus=float(overrides.get("cpus", tv.cpus)),
        memory_mb=int(overrides.get("memory_mb", tv.memory_mb)),
        storage_mb=int(overrides.get("storage_mb", tv.storage_mb)),
    )


@dataclass
class HeldTrial:
    """A trial this worker holds: under which lease, with what reserved, how it ended."""

    worker: WorkerIdentity
    node: WorkerNode
    lease: Lease
    trial: Trial
    keeper: LeaseKeeper
    reservation: Reservation | None = None
    outcome: TrialOutcome | None = None


def _report(keeper: LeaseKeeper, *events: dict[str, Any]) -> None:
    # One sequence number for every try: a repeat of a write that did commit is
    # acknowledged by lease_report, not applied twice.
    seq = keeper.next_seq()
    db_retry(
        write=lambda: lease_report(
            worker=keeper.worker, lease_id=keeper.lease.id, fence=keeper.lease.fence, local_seq=seq, events=list(events)
        ),
        what=f"progress of {keeper.lease.id}",
    )


def trial_execute(*, trial_id: str) -> None:
    """Run one trial end to end on this worker. Safe to call twice for the same trial."""
    work_root = Path(settings.SYNTH_WORK_DIR)
    try:
        host_reap(work_root=work_root)  # a killed sibling's sandboxes and work dirs
    except Exception:
        logger.exception("reaping what dead trial processes left failed")
    held = _trial_hold(trial_id=trial_id)
    if held is None:
        return
    held.keeper.start()
    work = None
    try:
        work = work_dir_make(root=work_root, name=f"{trial_id}.{held.lease.fence}")
        held.outcome = _trial_attempt(held=held, work=work)
        if held.outcome is not None:
            _trial_record(held=held)
    except StaleLease:
        logger.warning("trial %s: lease lost to another holder; its result is theirs", trial_id)
    except Exception as exc:
        # A platform error (not the agent's or the task's): the trial ends with it, visibly.
        logger.exception("trial %s failed in the platform", trial_id)
        _trial_fail(held=held, exc=exc)
    finally:
        held.keeper.stop()
        held.keeper.join(timeout=5)
        _reservation_release(held=held)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


def _trial_hold(*, trial_id: str) -> HeldTrial | None:
    """Claim the trial's lease (None when it is settled or held by another)."""
    node = db_retry(write=node_current, what="worker node")
    worker = db_retry(write=lambda: worker_get_or_create(name=f"trials@{node.name}"), what="worker identity")
    # A claim whose commit was not acknowledged looks held on a repeat: the lease then
    # lapses unused and the reaper hands the trial out again.
    lease = db_retry(
        write=lambda: trial_claim(worker=worker, trial_id=trial_id, node_name=node.name), what=f"claim of {trial_id}"
    )
    if lease is None:
        return None
    related = ("run__org", "run__spec__actor_version", "run__spec__judge_version", "task_version__archive", "group")
    trial = db_retry(write=lambda: Trial.objects.select_related(*related).get(pk=trial_id), what=f"trial {trial_id}")
    return HeldTrial(worker=worker, node=node, lease=lease, trial=trial, keeper=LeaseKeeper(worker=worker, lease=lease))


def _trial_attempt(*, held: HeldTrial, work: Path) -> TrialOutcome | None:
    """Admission, then the attempt. Returns the outcome to record; None when the lease
    was lost (the trial is someone else's now)."""
    trial, keeper = held.trial, held.keeper
    plan = trial.run.spec.plan
    need = trial_need(trial=trial, plan=plan)
    refused = _admit(held=held, need=need)
    if keeper.lost.is_set():
        return None
    if refused is not None:
        return refused
    db_retry(
        write=lambda: trial_mark_running(
            worker=held.worker,
            lease=held.lease,
            trial_id=trial.id,
            data={
                "task": trial.task_version.name,
                "attempt": trial.attempt,
                "node": held.node.name,
                "need": need.as_dict(),
            },
        ),
        what=f"start of {trial.id}",
        committed=lambda: Trial.objects.filter(pk=trial.id, status=TrialStatus.RUNNING).exists(),
    )
    return _trial_run(held=held, work=work, plan=plan)


def _admit(*, held: HeldTrial, need: Need) -> TrialOutcome | None:
    """Wait until the node's budget admits the trial. An outcome when it ends here instead:
    its need never fits, or it was cancelled while waiting."""
    node, trial, keeper = held.node, held.trial, held.keeper
    try:
        reservation = db_retry(
            write=lambda: admission_request(node=node, trial=trial, need=need), what=f"admission of {trial.id}"
        )
    except NeverFits as exc:
        return TrialOutcome(status=TrialStatus.FAILED, error_type="ResourcesExceedBudget", error_message=exc.message)
    held.reservation = reservation
    waited_since = None
    while not db_retry(write=lambda: admission_try(reservation=reservation), what=f"admission of {trial.id}"):
        if waited_since is None:
            waited_since = time.monotonic()
            usage = db_retry(write=lambda: node_usage(node=node), what="node usage")
            _report(
                keeper,
                {
                    "type": "admission.waiting",
                    "data": {"trial": trial.id, "node": node.name, "need": need.as_dict(), "usage": usage},
                },
            )
        if keeper.should_stop:
            break
        time.sleep(ADMISSION_POLL_SECONDS)
    if keeper.cancelled.is_set():
        return TrialOutcome(
            status=TrialStatus.CANCELLED, error_type="Cancelled", error_message="cancelled while waiting for resources"
        )
    if waited_since is not None and not keeper.lost.is_set():
        usage = db_retry(write=lambda: node_usage(node=node), what="node usage")
        waited = round(time.monotonic() - waited_since, 3)
        _report(
            keeper, {"type": "admission.granted", "data": {"trial": trial.id, "waited_sec": waited, "usage": usage}}
        )
    return None


def _trial_run(*, held: HeldTrial, work: Path, plan: dict[str, Any]) -> TrialOutcome | None:
    """The attempt in its sandbox, then its files to the object store."""
    trial, keeper = held.trial, held.keeper
    task_dir = task_version_materialize(task_version=trial.task_version, dest=work / "task")
    if plan.get("verifier") == "fresh":
        task_verifier_fresh(task_dir=task_dir)
    # A regrade's attempt is over already: its "agent" restores the retained workdir.
    regrade = trial.source_id is not None
    recipe = _actor_recipe(trial=trial)
    judge = _judge_recipe(trial=trial)
    access = judge_access = None
    who = "actor"
    try:
        if not regrade:
            access = db_retry(
                write=lambda: model_access_open(trial=trial, recipe=recipe), what=f"model access of {trial.id}"
            )
        if judge is not None:
            who = "judge"
            judge_access = db_retry(
                write=lambda: model_access_open(
                    trial=trial, recipe=judge, binding=_judge_binding(trial=trial), role="judge"
                ),
                what=f"judge model access of {trial.id}",
            )
    except (ModelAccessError, NotFound) as exc:
        # Before any sandbox exists: nothing to clean up, and the message says what to fix.
        _access_close(access=access)
        return TrialOutcome(
            status=TrialStatus.FAILED,
            error_type="ModelAccessError",
            error_message=f"judge: {exc.message}" if who == "judge" else exc.message,
        )
    try:
        if regrade:
            launch_plan = None
            agent_config, workdir = db_retry(
                write=lambda: _restore_agent_config(trial=trial, task_dir=task_dir, dest=work / "restore"),
                what=f"restore of {trial.id}",
            )
            instruction = trial.task_version.instruction
        else:
            launch_plan = trial_launch_plan(trial=trial, task_dir=task_dir, recipe=recipe, access=access)
            agent_config, workdir, instruction = None, launch_plan.workdir, launch_plan.instruction
        judge_plan = None
        if judge is not None:
            judge_plan = trial_launch_plan(
                trial=trial,
                task_dir=task_dir,
                recipe=judge,
                access=judge_access,
                instruction=judge_instruction(instruction=instruction, workdir=workdir),
                logs_dir=JUDGE_LOGS_DIR,
            )
        outcome, trial_dir = harbor_trial_run(
            trial=trial,
            task_dir=task_dir,
            trials_dir=work / "trials",
            launch_plan=launch_plan,
            keeper=keeper,
            access=access,
            judge_plan=judge_plan,
            judge_access=judge_access,
            agent_config=agent_config,
        )
    finally:
        # The attempt is over (or never started): its credentials must stop working now,
        # not when they expire.
        for opened in (access, judge_access):
            _access_close(access=opened)
    if keeper.lost.is_set():
        return None
    logger.info(
        "trial %s: attempt under lease %s (fence %d) ended %s, rewards %s; recording it",
        trial.id,
        held.lease.id,
        held.lease.fence,
        outcome.status,
        outcome.rewards,
    )
    return _artifacts_publish(held=held, outcome=outcome, trial_dir=trial_dir, launch_plan=launch_plan)


def _artifacts_publish(*, held: HeldTrial, outcome: TrialOutcome, trial_dir: Path, launch_plan: Any) -> TrialOutcome:
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


def _lease_completed(*, lease: Lease) -> bool:
    return Lease.objects.filter(pk=lease.id, fence=lease.fence, status=LeaseStatus.COMPLETED).exists()


def _trial_record(*, held: HeldTrial) -> None:
    """Write the outcome under the lease until it commits. A repeat after a commit whose
    acknowledgement was lost is recognised by the lease, completed at our fence."""
    outcome = held.outcome
    assert outcome is not None
    db_retry(
        write=lambda: trial_complete(worker=held.worker, lease=held.lease, trial_id=held.trial.id, outcome=outcome),
        what=f"result of {held.trial.id}",
        committed=lambda: _lease_completed(lease=held.lease),
    )


def _trial_fail(*, held: HeldTrial, exc: Exception) -> None:
    """End the trial with the platform error that stopped it (its rewards and timings if
    the attempt had finished). Nothing is written when the database stayed away longer
    than the retries: the lease then lapses and the reaper decides, as for a dead worker."""
    if isinstance(exc, TRANSIENT_DB_ERRORS):
        logger.error("trial %s: the database stayed unavailable; its lease will lapse", held.trial.id)
        return
    done = held.outcome
    held.outcome = TrialOutcome(
        status=TrialStatus.FAILED,
        rewards=done.rewards if done else None,
        error_type=type(exc).__name__,
        error_message=f"{exc}\n{traceback.format_exc(limit=5)}",
        timings=done.timings if done else {},
    )
    try:
        _trial_record(held=held)
    except StaleLease:
        pass
    except Exception:
        logger.exception("trial %s: recording its platform error failed", held.trial.id)


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


def _actor_recipe(*, trial: Trial) -> dict[str, Any]:
    from apps.profiles.selectors import profile_version_recipe

    return profile_version_recipe(profile_version=trial.run.spec.actor_version)


def _restore_agent_config(*, trial: Trial, task_dir: Path, dest: Path) -> tuple[Any, str]:
    """The regrade's agent, which puts the source attempt's retained workdir back where the
    source's launch plan had it (AgentConfig, that workdir)."""
    import json

    from harbor.models.trial.config import AgentConfig

    from apps.objects.services import object_read
    from synth_sandbox.support import task_workdir

    prefix = "artifacts/workdir/"
    workdir = task_workdir(task_dir=task_dir)
    dest.mkdir(parents=True, exist_ok=True)
    for artifact in Artifact.objects.filter(trial_id=trial.source_id).select_related("object"):
        if artifact.name == "launch-plan.json":
            workdir = json.loads(object_read(obj=artifact.object)).get("workdir") or workdir
        if artifact.kind != "work":
            continue
        relative = Path(artifact.name.removeprefix(prefix))
        if relative.is_absolute() or ".." in relative.parts:
            raise ValueError(f"artifact {artifact.id} has an unsafe name {artifact.name!r}")
        (dest / relative).parent.mkdir(parents=True, exist_ok=True)
        (dest / relative).write_bytes(object_read(obj=artifact.object))
    config = AgentConfig(
        import_path="synth_launcher.harbor_agent:RestoreAgent",
        kwargs={"source_dir": str(dest), "workdir": workdir, "source_trial": trial.source_id},
    )
    return config, workdir


def _judge_recipe(*, trial: Trial) -> dict[str, Any] | None:
    from apps.profiles.selectors import profile_version_recipe

    judge = trial.run.spec.judge_version
    return profile_version_recipe(profile_version=judge) if judge is not None else None


def _judge_binding(*, trial: Trial) -> dict[str, Any]:
    """The judge's own model binding, as pinned at admission."""
    return dict(trial.run.spec.judge_binding or {})


def trial_launch_plan(
    *,
    trial: Trial,
    task_dir: Path,
    recipe: dict[str, Any] | None = None,
    access: ModelAccess | None = None,
    instruction: str | None = None,
    logs_dir: str | None = None,
) -> Any:
    """The recipe interpreted for this attempt, by the one launcher (synth_launcher.launcher).

    ``access`` (apps.trials.model_access) is the attempt's model: the binding the harness sees
    (the bridge's address inside the sandbox) and the scoped credential. Without it, an
    engine that needs a model fails to launch with a clear LaunchError.
    """
    from harbor.models.task.task import Task as HarborTask

    from synth_launcher.launcher import (
        AGENT_LOGS_DIR,
        AttemptBinding,
        Bindings,
        RunBinding,
        TaskBinding,
        launch_plan_build,
    )
    from synth_sandbox.support import task_workdir

    if recipe is None:
        recipe = _actor_recipe(trial=trial)
    tv = trial.task_version
    harbor_task = HarborTask(task_dir)
    bindings = Bindings(
        task=TaskBinding(
            name=tv.name,
            workdir=task_workdir(task_dir=task_dir),  # the sandbox's cwd: task.toml, else the Dockerfile's WORKDIR
            instruction=instruction if instruction is not None else harbor_task.instruction,
            agent_timeout_sec=tv.agent_timeout_sec,
            id=tv.id,
            digest=tv.digest,
        ),
        run=RunBinding(id=trial.run_id, kind=trial.run.kind),
        attempt=AttemptBinding(trial_id=trial.id, index=trial.attempt, group_id=trial.group_id),
        model=access.binding if access is not None else None,
        credential=access.secret if access is not None else None,
        proxy_address=f"unix:{access.socket}" if access is not None else None,
    )
    return launch_plan_build(recipe=recipe, bindings=bindings, logs_dir=logs_dir or AGENT_LOGS_DIR)


def _timing(info: Any) -> dict[str, Any] | None:
    if info is None or info.started_at is None:
        return None
    out = {"started_at": info.started_at.isoformat()}
    if info.finished_at is not None:
        out["finished_at"] = info.finished_at.isoformat()
        out["seconds"] = round((info.finished_at - info.started_at).total_seconds(), 3)
    return out


def _environment_config(*, plan: dict[str, Any], access: ModelAccess | None = None) -> Any:
    """Harbor's environment for the plan. With model access (the local sandbox only, see
    apps.trials.model_access): the bridge to the proxy's socket and Claude Code on PATH."""
    from harbor.models.trial.config import EnvironmentConfig

    overrides = plan.get("resources") or {}
    common: dict[str, Any] = {
        "override_cpus": overrides.get("cpus"),
        "override_memory_mb": overrides.get("memory_mb"),
        "override_storage_mb": overrides.get("storage_mb"),
        "delete": True,
    }
    if access is not None:
        kwargs, env = sandbox_model_options(access=access)
        common.update(kwargs=kwargs, env=env)
    import_path = environment_import_path(plan=plan)
    if import_path is not None:
        return EnvironmentConfig(import_path=import_path, **common)
    return EnvironmentConfig(type=plan["environment"], **common)  # docker, daytona, modal, e2b, gke, ...


def _verifier_config(*, trial: Trial, judge_plan: Any) -> Any:
    from harbor.models.trial.config import VerifierConfig

    from apps.trials.judges import IMPORT_PATH as JUDGE_VERIFIER
    from synth_launcher.harbor_agent import CREDENTIAL_ENV

    plan = trial.run.spec.plan
    if judge_plan is None:
        return VerifierConfig(
            disable=trial.run.kind == RunKind.EXECUTE, override_timeout_sec=plan.get("verifier_timeout_sec")
        )
    return VerifierConfig(
        import_path=JUDGE_VERIFIER,
        kwargs={"launch_plan": judge_plan.to_dict()},
        # Harbor's persisted config redacts env values; kwargs would be stored in clear.
        env={CREDENTIAL_ENV: judge_plan.credential} if judge_plan.credential else {},
        # The judge's own deadline (its recipe's limit and setup), not the tests'.
        override_timeout_sec=plan.get("verifier_timeout_sec")
        or judge_plan.timeout_sec + judge_plan.setup_timeout_sec * len(judge_plan.setup) + 60,
    )


def harbor_trial_run(
    *,
    trial: Trial,
    task_dir: Path,
    trials_dir: Path,
    launch_plan: Any,
    keeper: LeaseKeeper,
    access: ModelAccess | None = None,
    judge_plan: Any = None,
    judge_access: ModelAccess | None = None,
    agent_config: Any = None,
) -> tuple[TrialOutcome, Path]:
    """Run Harbor's trial lifecycle (environment, agent setup, agent, verifier) with the
    plan's deadlines; cancel it when the lease keeper says so. With ``judge_plan``, the
    verifier is the run's judge (apps.trials.judges) instead of the task's tests.

    The agent/verification boundary (synth_sandbox.boundary) holds: when the agent phase ends,
    its processes are killed and the actor's credential (``access``) is revoked before
    anything is verified; a verification that could not produce a reward to credit is a
    ``VerifierError``, not a reward."""
    from harbor.models.trial.config import TaskConfig as HarborTaskConfig
    from harbor.models.trial.config import TrialConfig
    from harbor.trial.trial import Trial as HarborTrial

    from synth_launcher.harbor_agent import recipe_agent_config

    plan = trial.run.spec.plan
    if agent_config is None:
        agent_config = recipe_agent_config(plan=launch_plan, task_dir=task_dir)
        if _sanitize_git(plan=plan, task_dir=task_dir):
            agent_config.kwargs["sanitize_git"] = True
    if plan.get("agent_timeout_sec"):
        agent_config.override_timeout_sec = plan["agent_timeout_sec"]
    config = TrialConfig(
        task=HarborTaskConfig(path=task_dir),
        trial_name=trial.id,
        trials_dir=trials_dir,
        timeout_multiplier=plan.get("timeout_multiplier", 1.0),
        agent=agent_config,
        # The sandbox's model bridge serves the actor and the judge alike (each call carries
        # its own credential); either one needing a model is enough to set it up.
        environment=_environment_config(plan=plan, access=access or judge_access),
        verifier=_verifier_config(trial=trial, judge_plan=judge_plan),
        artifacts=_artifacts(trial=trial, plan=plan, workdir=launch_plan.workdir if launch_plan else None),
    )

    def revoke() -> None:
        try:
            if access is not None:
                db_retry(write=lambda: model_access_close(access=access), what="credential revocation")
        finally:
            connections.close_all()  # this thread's own connection

    async def main() -> tuple[Any, bool, str | None]:
        harbor_trial = await HarborTrial.create(config)
        boundary = trial_boundary_install(trial=harbor_trial, check_verifier=judge_plan is None, on_agent_end=revoke)
        try:
            task = asyncio.create_task(harbor_trial.run())
            while not task.done():
                if keeper.should_stop:
                    task.cancel()
                    try:
                        await task
                    except asyncio.CancelledError:
                        pass
                    return harbor_trial.result, True, None
                await asyncio.wait({task}, timeout=0.25)
            return task.result(), False, boundary.verifier_failure(result=task.result())
        finally:
            boundary.close()

    result, cancelled, verifier_failure = asyncio.run(main())
    timings = {
        "environment_setup": _timing(result.environment_setup),
        "agent_setup": _timing(result.agent_setup),
        "agent_execution": _timing(result.agent_execution),
        "verifier": _timing(result.verifier),
    }
    rewards = result.verifier_result.rewards if result.verifier_result is not None else None
    if cancelled:
        outcome = TrialOutcome(
            status=TrialStatus.CANCELLED,
            rewards=rewards,
            error_type="Cancelled",
            error_message="the run was cancelled",
            timings=timings,
        )
    elif verifier_failure is not None:
        outcome = TrialOutcome(
            status=TrialStatus.FAILED, error_type=VERIFIER_ERROR, error_message=verifier_failure, timings=timings
        )
    elif result.exception_info is not None:
        outcome = TrialOutcome(
            status=TrialStatus.FAILED,
            rewards=rewards,
            error_type=result.exception_info.exception_type,
            error_message=result.exception_info.exception_message,
            timings=timings,
        )
    else:
        outcome = TrialOutcome(status=TrialStatus.SUCCEEDED, rewards=rewards, timings=timings)
    return outcome, trials_dir / trial.id


def _artifacts(*, trial: Trial, plan: dict[str, Any], workdir: str | None) -> list[dict[str, Any]]:
    """What Harbor collects from the agent's environment. An unscored run's product is the
    work itself, a scored run keeps it to be regraded; a fresh verifier receives it whole
    (in a sandbox of its own, the workdir is the only thing the agent hands over)."""
    if workdir is None:
        return []
    if plan.get("verifier") == "fresh":
        return [{"source": workdir, "destination": "workdir"}]
    if trial.run.kind == RunKind.EXECUTE or plan.get("retain_workdir"):
        return [{"source": workdir, "destination": "workdir", "exclude": [".git", "__pycache__"]}]
    return []


def _sanitize_git(*, plan: dict[str, Any], task_dir: Path) -> bool:
    """The plan's setting, else the task's (task.toml ``[metadata] sanitize_git``)."""
    if plan.get("sanitize_git") is not None:
        return bool(plan["sanitize_git"])
    from harbor.models.task.task import Task as HarborTask

    return HarborTask(task_dir).config.metadata.get("sanitize_git") is True


def _artifact_name(relative: str) -> str:
    """A file name as text: the agent may have made names that are not UTF-8 (Python holds
    those bytes as surrogates, which no database or JSON document takes). Each such byte is
    written ``%XX``; every valid name is kept as it is."""
    return re.sub(r"[\udc80-\udcff]", lambda m: f"%{ord(m.group()) - 0xDC00:02X}", relative)


def _artifact_kind(name: str) -> str:
    top = name.split("/", 1)[0]
    if top == "artifacts" and "/outputs/" in f"/{name}":
        return "output"
    if name.startswith("artifacts/workdir/"):
        return "work"
    if name.endswith((".jsonl",)) and top == "agent":
        return "transcript"
    return {"agent": "agent", "verifier": "verifier", "artifacts": "artifact"}.get(top, "trial")


def artifacts_publish(*, trial: Trial, trial_dir: Path, launch_plan: Any) -> list[Artifact]:
    """Upload the trial's files (logs, transcript, verifier output, outputs) content-addressed.
    The launch plan goes too; it never holds the scoped credential (see LaunchPlan.to_dict)."""
    org = trial.run.org
    files: list[tuple[str, bytes]] = []
    if launch_plan is not None:  # a regrade launched no agent
        plan_doc = {**launch_plan.to_dict(), "digest": launch_plan.digest()}
        files.append(("launch-plan.json", canonical_bytes(plan_doc)))
    if trial_dir.is_dir():
        for path in sorted(trial_dir.rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            size = path.stat().st_size
            if size > settings.SYNTH_ARTIFACT_MAX_BYTES:
                logger.warning("artifact %s is %d bytes; over the limit, skipped", path, size)
                continue
            files.append((_artifact_name(path.relative_to(trial_dir).as_posix()), path.read_bytes()))
    made = []
    for name, data in files:
        obj = object_put(org=org, data=data)
        artifact, _ = Artifact.objects.get_or_create(
            trial=trial,
            name=name[:500],
            defaults={
                "run": trial.run,
                "kind": _artifact_kind(name),
                "object": obj,
                "sha256": obj.sha256,
                "size": obj.size,
            },
        )
        made.append(artifact)
    return made
