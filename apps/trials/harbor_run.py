"""One Harbor trial lifecycle (environment, agent setup, agent, verifier) in the sandbox,
cancelled when the lease keeper says so, and the attempt's outcome read from its result."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from apps.core.db import db_retry, db_side_run
from apps.runs.evaluation import VERIFIER_ERROR
from apps.runs.models import Trial, TrialStatus
from apps.runs.settlement import TrialOutcome
from apps.trials.harbor_config import trial_config
from apps.trials.lease_keeper import LeaseKeeper
from apps.trials.model_access import ModelAccess, model_access_close
from synth_sandbox.boundary import trial_boundary_install


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
    ``VerifierError``, not a reward. Returns the outcome and Harbor's trial directory."""
    from harbor.trial.trial import Trial as HarborTrial

    config = trial_config(
        trial=trial,
        task_dir=task_dir,
        trials_dir=trials_dir,
        launch_plan=launch_plan,
        access=access,
        judge_plan=judge_plan,
        judge_access=judge_access,
        agent_config=agent_config,
    )

    def revoke() -> None:
        # The boundary's thread lives for this one call: the write runs on the process' side
        # thread for revocations and its kept connection, not on a new one of this thread's.
        if access is not None:
            db_side_run(
                call=lambda: db_retry(write=lambda: model_access_close(access=access), what="credential revocation"),
                lane="revocation",
            )

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
    return _outcome(result=result, cancelled=cancelled, verifier_failure=verifier_failure), trials_dir / trial.id


def _outcome(*, result: Any, cancelled: bool, verifier_failure: str | None) -> TrialOutcome:
    """The attempt's outcome from Harbor's result: cancelled, a verification that credits
    nothing, the agent's or environment's error, or success (with the rewards, if any)."""
    timings = {
        "environment_setup": _timing(result.environment_setup),
        "agent_setup": _timing(result.agent_setup),
        "agent_execution": _timing(result.agent_execution),
        "verifier": _timing(result.verifier),
    }
    rewards = result.verifier_result.rewards if result.verifier_result is not None else None
    if cancelled:
        return TrialOutcome(
            status=TrialStatus.CANCELLED,
            rewards=rewards,
            error_type="Cancelled",
            error_message="the run was cancelled",
            timings=timings,
        )
    if verifier_failure is not None:
        return TrialOutcome(
            status=TrialStatus.FAILED, error_type=VERIFIER_ERROR, error_message=verifier_failure, timings=timings
        )
    if result.exception_info is not None:
        return TrialOutcome(
            status=TrialStatus.FAILED,
            rewards=rewards,
            error_type=result.exception_info.exception_type,
            error_message=result.exception_info.exception_message,
            timings=timings,
        )
    return TrialOutcome(status=TrialStatus.SUCCEEDED, rewards=rewards, timings=timings)


def _timing(info: Any) -> dict[str, Any] | None:
    if info is None or info.started_at is None:
        return None
    out = {"started_at": info.started_at.isoformat()}
    if info.finished_at is not None:
        out["finished_at"] = info.finished_at.isoformat()
        out["seconds"] = round((info.finished_at - info.started_at).total_seconds(), 3)
    return out
