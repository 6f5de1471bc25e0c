"""``harness_check ENGINE``: run the installed harness on a scripted task through a real proxy
process, and record whether what it sends can be captured and trained on exactly.

One check, in order:

1. The harness build (apps.trials.harness_check.identity): the engine's executable or file,
   its version and sha256.
2. A scripted route (:data:`ROUTE`, Qwen3 format, the ``harness-check`` script of
   apps/proxy/samplers/harness_script.py emitting native tool-call tokens) and the proxy
   process (apps.trials.harness_check.proxy_process: the production ASGI app on a private
   socket, recording each request's shape).
3. One attempt as a trials host runs it: the launcher's plan for the engine's recipe, Harbor's
   trial in the local sandbox with the model bridge, a credential scoped to the check
   (run ``harness-check``, attempt = the check's id), the task's verifier.
4. The analysis (apps.trials.harness_check.analysis): (a) every captured call re-renders to
   its captured prompt ids, (b) every sampled tool call comes back unchanged and its ids are
   in the next prompt, (c) the harness ended without error and the task's file is there.
5. A HarnessCheck row (engine, version, digest, family, passed, report).

The check's own calls stay captured under the organization :data:`CHECK_ORG` (they belong
to no run and never train).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connections

from apps.accounts.services import model_credential_issue, model_credential_revoke, org_get_or_create
from apps.core.ids import new_id
from apps.proxy.models import HarnessCheck, Interaction
from apps.proxy.samplers import harness_script as script
from apps.trials.harness_check.analysis import Call, rerender_check, shapes_summary, tool_round_trip
from apps.trials.harness_check.identity import HarnessIdentity, HarnessUnavailable, harness_identity
from synth_launcher import engines

ROUTE = "harness-check-qwen3"
CHECK_ORG = "harness-check"
CHECK_RUN = "harness-check"
AGENT_TIMEOUT_SEC = 300.0
PROXY_START_TIMEOUT_SEC = 60.0
ROOT = Path(__file__).resolve().parents[3]

# The recipe each checkable engine runs: what a train run's profile would hold, minus the
# task-specific parts.
RECIPES: dict[str, dict[str, Any]] = {
    "claude-code": {
        "engine": {"name": "claude-code", "version": "2"},
        "workdir": "${task.workdir}",
        "args": ["--max-turns", "6"],
        "instruction": {"via": "argument"},
        "limits": {"timeout_sec": AGENT_TIMEOUT_SEC},
    },
    "codex": {
        "engine": {"name": "codex", "version": "0"},
        "instruction": {"via": "argument"},
        "limits": {"timeout_sec": AGENT_TIMEOUT_SEC},
    },
    "synth-mini": {
        "engine": {"name": "synth-mini", "version": "1"},
        "args": ["--max-turns", "6"],
        "instruction": {"via": "argument"},
        "limits": {"timeout_sec": AGENT_TIMEOUT_SEC},
    },
}


class HarnessCheckError(Exception):
    """The check could not run at all (bad input, missing prerequisite): one line for the operator."""


@dataclass(frozen=True)
class AttemptOutcome:
    exception_type: str | None
    exception_message: str | None
    rewards: dict[str, Any] | None


def _task_dir(root: Path) -> Path:
    task = root / "task" / "harness-check"
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    (task / "task.toml").write_text(
        textwrap.dedent(f"""\
        version = "1.0"
        [agent]
        timeout_sec = {AGENT_TIMEOUT_SEC}
        [verifier]
        timeout_sec = 30.0
        [environment]
        memory_mb = 2048
        storage_mb = 512
        workdir = "/app"
        """)
    )
    (task / "instruction.md").write_text(script.instruction())
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        f'if [ "$(cat /app/{script.OUT_FILE})" = {script.EXPECTED_TEXT} ]; then echo 1; else echo 0; fi '
        "> /logs/verifier/reward.txt\n"
    )
    return task


def _route() -> Any:
    from apps.proxy.routes import route_upsert

    route, _ = route_upsert(
        name=ROUTE,
        family=script.FAMILY,
        tokenizer=script.FAMILY,
        context_window=131072,
        max_output=32000,
        sampler_backend="scripted",
        sampler_config={"script": "harness-check"},
    )
    return route


def _proxy_start(*, socket_path: Path, record: Path, log: Path, env: Mapping[str, str]) -> subprocess.Popen:
    from apps.trials.model_access import proxy_listening

    child_env = {**env, "SYNTH_TOKENIZER_DIR": str(settings.SYNTH_TOKENIZER_DIR)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "apps.trials.harness_check.proxy_process", "--uds", str(socket_path),
             "--record", str(record)],
            cwd=ROOT, env=child_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + PROXY_START_TIMEOUT_SEC
    while not proxy_listening(path=socket_path):
        if proc.poll() is not None or time.monotonic() > deadline:
            _proxy_stop(proc)
            tail = log.read_text(errors="replace")[-2000:]
            raise HarnessCheckError(f"the check's model proxy did not start on {socket_path}: {tail.strip()}")
        time.sleep(0.1)
    return proc


def _proxy_stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _attempt(
    *, identity: HarnessIdentity, check_id: str, route: Any, task_dir: Path, trials_dir: Path, socket_path: Path
) -> AttemptOutcome:
    """One attempt of the engine's recipe on the check's task, as a trials host runs it."""
    from harbor.models.task.task import Task as HarborTask
    from harbor.models.trial.config import EnvironmentConfig, TrialConfig
    from harbor.models.trial.config import TaskConfig as HarborTaskConfig
    from harbor.trial.trial import Trial as HarborTrial

    from apps.trials.model_access import (
        ModelAccess,
        ModelAccessError,
        environment_import_path,
        host_binaries_bind,
        sandbox_model_options,
    )
    from synth_launcher.harbor_agent import recipe_agent_config
    from synth_launcher.launcher import (
        AttemptBinding,
        Bindings,
        ModelBinding,
        RunBinding,
        TaskBinding,
        launch_plan_build,
    )
    from synth_sandbox.boundary import trial_boundary_install
    from synth_sandbox.support import task_workdir

    # Every installed harness executable, as a trials host binds them (the engine's own required).
    try:
        binds = host_binaries_bind(required=engines.ENGINES[identity.engine].host_binary)
    except ModelAccessError as exc:
        raise HarnessCheckError(exc.message) from None
    org = org_get_or_create(slug=CHECK_ORG, name="Harness checks")
    cred, secret = model_credential_issue(
        org=org,
        run_id=CHECK_RUN,
        trial_id=check_id,
        route=route.name,
        snapshot="",
        ttl=timedelta(seconds=AGENT_TIMEOUT_SEC * 2 + settings.SYNTH_MODEL_CREDENTIAL_MARGIN_SECONDS),
    )
    port = int(settings.SYNTH_SANDBOX_MODEL_PORT)
    access = ModelAccess(
        binding=ModelBinding(name=route.name, base_url=f"http://127.0.0.1:{port}", route=route.name),
        credential=cred,
        secret=secret,
        socket=socket_path,
        port=port,
        binds=binds,
    )
    harbor_task = HarborTask(task_dir)
    bindings = Bindings(
        task=TaskBinding(
            name=harbor_task.name,
            workdir=task_workdir(task_dir=task_dir),
            instruction=harbor_task.instruction,
            agent_timeout_sec=AGENT_TIMEOUT_SEC,
        ),
        run=RunBinding(id=CHECK_RUN, kind="evaluate"),
        attempt=AttemptBinding(trial_id=check_id, index=0),
        model=access.binding,
        credential=secret,
        proxy_address=f"unix:{socket_path}",
    )
    recipe = {**RECIPES[identity.engine], "model": {"route": route.name}}
    if identity.version:  # the installed build's, as a profile pinning it would say
        recipe["engine"] = {"name": identity.engine, "version": identity.version[:64]}
    plan = launch_plan_build(recipe=recipe, bindings=bindings)
    kwargs, env = sandbox_model_options(access=access)
    config = TrialConfig(
        task=HarborTaskConfig(path=task_dir),
        trial_name=check_id,
        trials_dir=trials_dir,
        agent=recipe_agent_config(plan=plan, task_dir=task_dir),
        environment=EnvironmentConfig(
            import_path=environment_import_path(plan={}), kwargs=kwargs, env=env, delete=True
        ),
    )

    def revoke() -> None:
        try:
            model_credential_revoke(cred=cred)
        finally:
            connections.close_all()  # this thread's own connection

    async def main() -> Any:
        trial = await HarborTrial.create(config)
        boundary = trial_boundary_install(trial=trial, on_agent_end=revoke)
        try:
            return await trial.run()
        finally:
            boundary.close()

    try:
        result = asyncio.run(main())
    finally:
        model_credential_revoke(cred=cred)
    info = result.exception_info
    return AttemptOutcome(
        exception_type=info.exception_type if info else None,
        exception_message=info.exception_message if info else None,
        rewards=result.verifier_result.rewards if result.verifier_result else None,
    )


def _calls(*, check_id: str) -> list[Call]:
    from apps.proxy.fidelity import interaction_payload

    rows = Interaction.objects.filter(run_id=CHECK_RUN, trial_id=check_id).select_related("org").order_by("created_at")
    return [
        Call(id=row.id, session_id=row.session_id, agent_id=row.agent_id, payload=interaction_payload(interaction=row))
        for row in rows
    ]


def _shapes(record: Path) -> list[dict[str, Any]]:
    import json

    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def _harness_findings(*, outcome: AttemptOutcome, calls: list[Call]) -> tuple[dict[str, Any], list[str]]:
    rewards = outcome.rewards or {}
    reward = rewards.get("reward")
    failures = []
    if outcome.exception_type:
        failures.append(f"the harness did not end cleanly: {outcome.exception_type}: {outcome.exception_message}")
    if reward != 1.0:
        failures.append(
            f"the task's effect is missing: {script.OUT_FILE} does not hold {script.EXPECTED_TEXT!r} (reward {reward})"
        )
    if not any(block.get("type") == "tool_use" for c in calls for block in c.payload.get("content") or []):
        failures.append("no call was answered with a tool call: the scripted task never reached the harness's tools")
    return {
        "exception_type": outcome.exception_type,
        "exception_message": outcome.exception_message,
        "rewards": rewards,
    }, failures


def harness_check_run(*, engine: str, env: Mapping[str, str] | None = None) -> HarnessCheck:
    """Run the check for ``engine`` and store its HarnessCheck (passed or not).

    ``env``: the proxy process's environment (default this process's: the same database,
    broker and object store). HarnessCheckError when the check cannot run at all."""
    from apps.proxy.adapters.registry import adapter_for
    from apps.proxy.tokenizers import TokenizerNotProvisioned

    try:
        identity = harness_identity(engine=engine)
    except HarnessUnavailable as exc:
        raise HarnessCheckError(str(exc)) from None
    binary = engines.ENGINES[engine].host_binary
    if binary is not None:
        from apps.trials.model_access import ModelAccessError, host_binary_check

        try:
            host_binary_check(binary=binary, path=identity.path)  # what a trials host requires to bind it
        except ModelAccessError as exc:
            raise HarnessCheckError(exc.message) from None
    try:
        adapter_for(script.FAMILY)
    except TokenizerNotProvisioned as exc:
        raise HarnessCheckError(str(exc)) from None
    check_id = new_id("hck")
    route = _route()
    work = Path(tempfile.mkdtemp(prefix="synth-hc-"))  # short: a socket path holds 107 bytes
    socket_path, record = work / "proxy.sock", work / "requests.jsonl"
    started = time.monotonic()
    try:
        task_dir = _task_dir(work)
        proxy = _proxy_start(socket_path=socket_path, record=record, log=work / "proxy.log", env=env or os.environ)
        try:
            outcome = _attempt(
                identity=identity,
                check_id=check_id,
                route=route,
                task_dir=task_dir,
                trials_dir=work / "trials",
                socket_path=socket_path,
            )
        finally:
            _proxy_stop(proxy)
        calls = _calls(check_id=check_id)
        rerender_rows, rerender_failures = rerender_check(calls=calls)
        tool_rows, tool_failures = tool_round_trip(calls=calls)
        harness, harness_failures = _harness_findings(outcome=outcome, calls=calls)
        shapes = _shapes(record)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    failures = rerender_failures + tool_failures + harness_failures
    if not calls:
        failures.insert(0, "the harness made no model call through the proxy")
    report = {
        "harness": {
            "engine": engine,
            "version": identity.version,
            "digest": identity.digest,
            "path": str(identity.path),
        },
        "route": {"name": route.name, "family": route.family},
        "requests": shapes_summary(shapes=shapes),
        "calls": rerender_rows,
        "tool_calls": tool_rows,
        "attempt": harness,
        "checks": {
            "rerender": not rerender_failures and bool(calls),
            "tool_round_trip": not tool_failures and bool(tool_rows),
            "harness": not harness_failures,
        },
        "failures": failures,
        "seconds": round(time.monotonic() - started, 1),
    }
    return HarnessCheck.objects.create(
        id=check_id,
        engine=engine,
        harness_version=identity.version,
        digest=identity.digest,
        family=route.family,
        passed=not failures,
        report=report,
    )
