"""Model access for trials (apps.trials.model_access): the route, the scoped credential, the
sandbox options, and the worker's use of them (issued before the sandbox, revoked after)."""

from __future__ import annotations

import hashlib
import shutil
import socket
import tempfile
import textwrap
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from apps.accounts.models import ModelCredential
from apps.objects.services import object_read
from apps.proxy.credentials import caller_authenticate
from apps.proxy.errors import AuthenticationFailed
from apps.proxy.routes import route_upsert
from apps.runs import tasks as run_tasks
from apps.runs.dispatch import run_dispatch
from apps.runs.models import Trial
from apps.runs.services import run_schedule
from apps.trials import tasks as trial_tasks
from apps.trials.model_access import (
    SANDBOX_CLAUDE,
    ModelAccessError,
    claude_code_binary,
    credential_ttl,
    model_access_close,
    model_access_open,
    sandbox_model_options,
    staged_for_sandbox,
)
from apps.trials.pipeline import trial_execute
from synth_launcher.engines import CODEX_BINARY
from synth_launcher.launcher import launch_needs
from tests.factories import make_dataset_of, make_profile_version, make_task_version_unchecked

ROUTE = "qwen3-unit"
COMMAND_RECIPE = {
    "model": {"route": ROUTE},
    "engine": {"name": "command", "version": "1"},
    # What the agent sees: the bridge's address, the credential's scheme, Claude Code on PATH.
    "command": [
        "bash",
        "-c",
        'echo "$ANTHROPIC_BASE_URL ${ANTHROPIC_API_KEY%%_*} $(command -v claude)" > /app/seen.txt',
    ],
    "instruction": {"via": "stdin"},
    "limits": {"timeout_sec": 60},
}


@pytest.fixture
def proxy_socket(settings) -> Iterator[Path]:
    """A listening Unix socket standing in for the proxy (accepted, never answered)."""
    directory = tempfile.mkdtemp(prefix="synth-ma-")
    path = Path(directory) / "proxy.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(16)
    settings.SYNTH_PROXY_SOCKET = path
    try:
        yield path
    finally:
        server.close()
        path.unlink(missing_ok=True)
        path.parent.rmdir()


@pytest.fixture
def route(db):
    made, _ = route_upsert(
        name=ROUTE,
        family="qwen3",
        tokenizer="qwen3",
        context_window=32768,
        max_output=4096,
        sampler_backend="instant",
        sampler_config={},
        aliases=[],
    )
    return made


def _task_dir(root: Path, test: str = "echo 1 > /logs/verifier/reward.txt") -> Path:
    d = root / "task"
    (d / "environment").mkdir(parents=True)
    (d / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    (d / "task.toml").write_text(
        textwrap.dedent("""\
        [agent]
        timeout_sec = 30.0
        [verifier]
        timeout_sec = 30.0
        [environment]
        memory_mb = 512
        storage_mb = 256
        workdir = "/app"
        """)
    )
    (d / "instruction.md").write_text("Report what you see.\n")
    (d / "tests").mkdir()
    (d / "tests" / "test.sh").write_text(f"#!/bin/bash\n{test}\n")
    return d


def _trial(alice, tmp_path, recipe, *, plan=None, test="echo 1 > /logs/verifier/reward.txt") -> Trial:
    tv = make_task_version_unchecked(org=alice.org, path=_task_dir(tmp_path, test), name="unit/model-access")
    dsv = make_dataset_of(org=alice.org, name="unit", version=tmp_path.name, task_versions=[tv])
    actor = make_profile_version(org=alice.org, name="with-model", recipe=recipe)
    body = {
        "kind": "evaluate",
        "dataset": dsv.reference,
        "actor": {"profile": actor.profile.name, "version": actor.version},
        "plan": {"attempts_per_task": 1, **(plan or {})},
    }
    resp = alice.client.post("/api/runs", body, format="json")
    assert resp.status_code == 201, resp.content
    run_schedule(run_id=resp.json()["id"])
    run_dispatch(run_id=resp.json()["id"])
    return Trial.objects.select_related("run__spec", "group", "task_version").get(run_id=resp.json()["id"])


@pytest.fixture
def no_broker(monkeypatch):
    """Work is driven by hand here: nothing goes to the broker."""
    for task in (run_tasks.run_schedule_task, run_tasks.run_dispatch_task, trial_tasks.trial_execute_task):
        monkeypatch.setattr(task, "delay", lambda *args, **kwargs: None)


# ---------------------------------------------------------------- the pieces


@pytest.mark.django_db
def test_credential_is_scoped_to_the_trial_and_its_route_and_revoked(alice, tmp_path, route, proxy_socket, no_broker):
    trial = _trial(alice, tmp_path, COMMAND_RECIPE, plan={"timeout_multiplier": 2})
    before = timezone.now()
    access = model_access_open(trial=trial, recipe=COMMAND_RECIPE)
    assert access is not None
    cred = ModelCredential.objects.get(pk=access.credential.pk)
    assert (cred.org_id, cred.run_id, cred.trial_id, cred.route, cred.snapshot) == (
        trial.run.org_id,
        trial.run_id,
        trial.id,
        ROUTE,
        "",
    )
    # The agent's deadline as the trial applies it (min(recipe 60, task 30) x 2) + the margin.
    expected = before + timedelta(seconds=60 + settings.SYNTH_MODEL_CREDENTIAL_MARGIN_SECONDS)
    assert abs((cred.expires_at - expected).total_seconds()) < 5
    assert access.binding.name == ROUTE and access.binding.route == ROUTE
    assert access.binding.base_url == f"http://127.0.0.1:{settings.SYNTH_SANDBOX_MODEL_PORT}"
    assert access.secret.startswith("synm_") and access.secret not in repr(access)
    # The proxy takes it for this trial and this route only.
    caller = caller_authenticate(secret=access.secret)
    assert (caller.kind, caller.trial_id, caller.run_id) == ("attempt", trial.id, trial.run_id)

    model_access_close(access=access)
    cred.refresh_from_db()
    assert cred.revoked_at is not None
    with pytest.raises(AuthenticationFailed, match="revoked"):
        caller_authenticate(secret=access.secret)
    model_access_close(access=access)  # idempotent


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": {"route": "no-such-route"}}, "model route 'no-such-route' does not exist"),
    ],
)
def test_an_unusable_binding_is_refused_before_any_credential(
    alice, tmp_path, route, proxy_socket, no_broker, change, message
):
    recipe = {**COMMAND_RECIPE, **change}
    trial = _trial(alice, tmp_path, recipe)
    with pytest.raises(ModelAccessError, match=message):
        model_access_open(trial=trial, recipe=recipe)
    assert not ModelCredential.objects.exists()


@pytest.mark.django_db
def test_no_proxy_no_bridge_or_disabled_route_are_clear_errors(
    alice, tmp_path, route, proxy_socket, no_broker, settings
):
    trial = _trial(alice, tmp_path, COMMAND_RECIPE)
    route.inference_enabled = False
    route.save()
    with pytest.raises(ModelAccessError, match="inference disabled"):
        model_access_open(trial=trial, recipe=COMMAND_RECIPE)
    route.inference_enabled = True
    route.save()

    settings.SYNTH_PROXY_SOCKET = proxy_socket.with_name("nobody.sock")
    with pytest.raises(ModelAccessError, match="not listening on .*nobody.sock"):
        model_access_open(trial=trial, recipe=COMMAND_RECIPE)
    settings.SYNTH_PROXY_SOCKET = proxy_socket

    # (In memory only: a stored spec is immutable.)
    trial.run.spec.plan = {**trial.run.spec.plan, "environment": "docker"}
    with pytest.raises(ModelAccessError, match="no model bridge"):
        model_access_open(trial=trial, recipe=COMMAND_RECIPE)
    assert not ModelCredential.objects.exists()


@pytest.mark.django_db
def test_claude_code_must_be_installed_as_a_native_executable(
    alice, tmp_path, route, proxy_socket, no_broker, settings
):
    recipe = {
        "model": {"route": ROUTE},
        "engine": {"name": "claude-code", "version": "2.1"},
        "limits": {"timeout_sec": 60},
    }
    trial = _trial(alice, tmp_path, recipe)
    settings.SYNTH_CLAUDE_CODE_BIN = str(tmp_path / "missing" / "claude")
    with pytest.raises(ModelAccessError, match=r"Claude Code is not installed .*`npm ci`"):
        model_access_open(trial=trial, recipe=recipe)
    stub = tmp_path / "claude"
    stub.write_text("#!/bin/sh\necho placeholder\n")
    stub.chmod(0o755)
    settings.SYNTH_CLAUDE_CODE_BIN = str(stub)
    with pytest.raises(ModelAccessError, match="not a native executable"):
        model_access_open(trial=trial, recipe=recipe)
    assert not ModelCredential.objects.exists()
    # Another engine with a model does not need it: no bind, but access.
    access = model_access_open(trial=trial, recipe=COMMAND_RECIPE)
    assert access is not None and SANDBOX_CLAUDE not in [target for _, target in access.binds]


@pytest.mark.django_db
def test_codex_must_be_installed_as_a_native_executable(alice, tmp_path, route, proxy_socket, no_broker, settings):
    recipe = {
        "model": {"route": ROUTE},
        "engine": {"name": "codex", "version": "0.171.0"},
        "limits": {"timeout_sec": 60},
    }
    trial = _trial(alice, tmp_path, recipe)
    installed = Path(settings.SYNTH_CODEX_SANDBOX_BIN)
    settings.SYNTH_CODEX_SANDBOX_BIN = str(tmp_path / "missing" / "codex")
    with pytest.raises(ModelAccessError, match=r"Codex is not installed at .*SYNTH_CODEX_SANDBOX_BIN.*`npm ci`"):
        model_access_open(trial=trial, recipe=recipe)
    # node_modules/.bin/codex is the node launcher, which cannot run in a sandbox without node.
    settings.SYNTH_CODEX_SANDBOX_BIN = str(installed.parents[5] / ".bin" / "codex")
    with pytest.raises(ModelAccessError, match="Codex at .* is not a native executable"):
        model_access_open(trial=trial, recipe=recipe)
    assert not ModelCredential.objects.exists()
    # The default is the native executable npm installed (package.json pins it): bound, with
    # Claude Code beside it, both in /synth/bin.
    settings.SYNTH_CODEX_SANDBOX_BIN = str(installed)
    access = model_access_open(trial=trial, recipe=recipe)
    assert access is not None
    # The executable itself, or its world-readable copy where the checkout is private (mode 0700).
    assert dict((target, host) for host, target in access.binds)[CODEX_BINARY.target] == staged_for_sandbox(
        path=installed.resolve()
    )
    assert {target for _, target in access.binds} == {SANDBOX_CLAUDE, CODEX_BINARY.target}


@pytest.mark.django_db
def test_engines_without_a_model_get_no_access(alice, tmp_path, route, proxy_socket, no_broker):
    oracle = {"model": {"route": ROUTE}, "engine": {"name": "oracle", "version": "1"}, "limits": {"timeout_sec": 60}}
    trial = _trial(alice, tmp_path, oracle)
    assert model_access_open(trial=trial, recipe=oracle) is None
    nop = {"engine": {"name": "nop", "version": "1"}, "limits": {"timeout_sec": 60}}
    assert model_access_open(trial=_trial(alice, tmp_path / "2", nop), recipe=nop) is None
    assert not ModelCredential.objects.exists()


def test_credential_ttl_follows_the_agent_deadline(settings):
    settings.SYNTH_MODEL_CREDENTIAL_MARGIN_SECONDS = 100
    recipe = {**COMMAND_RECIPE, "limits": {"timeout_sec": 600, "setup_timeout_sec": 50}, "setup": ["a", "b"]}

    def ttl(task_agent_timeout_sec: float | None, plan: dict) -> timedelta:
        return credential_ttl(
            needs=launch_needs(recipe=recipe, task_agent_timeout_sec=task_agent_timeout_sec), plan=plan
        )

    assert ttl(None, {}) == timedelta(seconds=600 + 100 + 100)
    assert ttl(120, {}) == timedelta(seconds=120 + 100 + 100)
    assert ttl(120, {"agent_timeout_sec": 300, "timeout_multiplier": 2}) == timedelta(seconds=600 + 100 + 100)
    # Without setup commands there is no setup budget, whatever its deadline.
    recipe.pop("setup")
    assert ttl(None, {}) == timedelta(seconds=600 + 100)


def test_sandbox_options_bridge_the_proxy_and_put_claude_on_path(tmp_path, settings):
    from types import SimpleNamespace

    from synth_sandbox.sandbox import SANDBOX_PATH

    settings.SYNTH_SANDBOX_MODEL_MAX_CONNECTIONS = 7
    binds = ((Path("/host/claude"), SANDBOX_CLAUDE), (Path("/host/codex"), CODEX_BINARY.target))
    access = SimpleNamespace(socket=tmp_path / "p.sock", port=18123, binds=binds, harness_binds=())
    kwargs, env = sandbox_model_options(access=access)
    assert kwargs == {
        "model_socket": str(tmp_path / "p.sock"),
        "model_port": 18123,
        "model_max_connections": 7,
        "extra_ro_binds": [f"/host/claude:{SANDBOX_CLAUDE}", "/host/codex:/synth/bin/codex"],
    }
    assert env == {"PATH": f"/synth/bin:{SANDBOX_PATH}"}
    bare = SimpleNamespace(socket=tmp_path / "p.sock", port=1, binds=(), harness_binds=())
    kwargs, env = sandbox_model_options(access=bare)
    assert "extra_ro_binds" not in kwargs and env == {}
    # A harness tree is bound but stays off PATH: its python must not shadow the task's.
    tree = SimpleNamespace(socket=tmp_path / "p.sock", port=1, binds=(), harness_binds=("/h/msa:/synth/msa",))
    kwargs, env = sandbox_model_options(access=tree)
    assert kwargs["extra_ro_binds"] == ["/h/msa:/synth/msa"] and env == {}


MINI_SWE_AGENT_RECIPE = {
    "model": {"route": ROUTE},
    "engine": {"name": "mini-swe-agent", "version": "2.4.6"},
    "limits": {"timeout_sec": 60},
}


def _fake_tree(root: Path, *, interpreter: str, lock: bytes) -> Path:
    home = root / "mini-swe-agent"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "python").symlink_to(interpreter)
    (home / ".lock.sha256").write_text(hashlib.sha256(lock).hexdigest() + f"-{interpreter}\n")
    for directory in (root, home, home / "bin"):
        directory.chmod(0o755)
    return home


@pytest.mark.django_db
def test_mini_swe_agent_gets_its_checked_venv_bound(alice, tmp_path, route, proxy_socket, no_broker, settings):
    from apps.trials.harnesses import LOCKS_DIR

    lock = (LOCKS_DIR / "mini-swe-agent.txt").read_bytes()
    trial = _trial(alice, tmp_path, MINI_SWE_AGENT_RECIPE)
    settings.SYNTH_HARNESSES_DIR = tmp_path / "none"
    with pytest.raises(ModelAccessError, match=r"mini-swe-agent is not installed .*deploy/harnesses.sh"):
        model_access_open(trial=trial, recipe=MINI_SWE_AGENT_RECIPE)
    stale = tmp_path / "stale"
    _fake_tree(stale, interpreter="/usr/bin/python3", lock=b"another lock")
    settings.SYNTH_HARNESSES_DIR = stale
    with pytest.raises(ModelAccessError, match="built from another lock"):
        model_access_open(trial=trial, recipe=MINI_SWE_AGENT_RECIPE)
    hidden = tmp_path / "hidden"
    outside = tmp_path / "py" / "python3"  # not under /usr or /opt: absent in the sandbox
    outside.parent.mkdir()
    outside.write_text("")
    _fake_tree(hidden, interpreter=str(outside), lock=lock)
    settings.SYNTH_HARNESSES_DIR = hidden
    with pytest.raises(ModelAccessError, match="not visible in the sandbox"):
        model_access_open(trial=trial, recipe=MINI_SWE_AGENT_RECIPE)
    assert not ModelCredential.objects.exists()

    private = tmp_path / "private"  # pytest's tmp_path is in a directory of mode 0700
    _fake_tree(private, interpreter="/usr/bin/python3", lock=lock)
    settings.SYNTH_HARNESSES_DIR = private
    with pytest.raises(ModelAccessError, match="is not readable by other users"):
        model_access_open(trial=trial, recipe=MINI_SWE_AGENT_RECIPE)
    assert not ModelCredential.objects.exists()

    good = Path(tempfile.mkdtemp(prefix="synth-msa-tree-", dir="/tmp"))
    home = _fake_tree(good, interpreter="/usr/bin/python3", lock=lock)
    settings.SYNTH_HARNESSES_DIR = good
    try:
        access = model_access_open(trial=trial, recipe=MINI_SWE_AGENT_RECIPE)
    finally:
        shutil.rmtree(good)
    assert access is not None and access.harness_binds == (f"{home.resolve()}:/synth/mini-swe-agent",)
    kwargs, env = sandbox_model_options(access=access)
    assert f"{home.resolve()}:/synth/mini-swe-agent" in kwargs["extra_ro_binds"]
    # Engines without a harness tree bind none.
    assert model_access_open(trial=trial, recipe=COMMAND_RECIPE).harness_binds == ()


# ---------------------------------------------------------------- the worker


def test_unknown_route_fails_the_trial_before_the_sandbox(transactional_db, alice, tmp_path, proxy_socket, no_broker):
    recipe = {**COMMAND_RECIPE, "model": {"route": "no-such-route"}}
    trial = _trial(alice, tmp_path, recipe)
    trial_execute(trial_id=trial.id)
    trial.refresh_from_db()
    assert trial.status == "failed"
    assert trial.error_type == "ModelAccessError"
    assert "model route 'no-such-route' does not exist" in trial.error_message
    assert "Traceback" not in trial.error_message
    assert not trial.timings  # no environment was ever set up
    assert not ModelCredential.objects.exists()


def test_a_trial_sees_the_bridge_and_its_credential_is_revoked_after(
    transactional_db, alice, tmp_path, route, proxy_socket, no_broker
):
    claude = claude_code_binary()
    want = f"http://127.0.0.1:{settings.SYNTH_SANDBOX_MODEL_PORT} synm {SANDBOX_CLAUDE if claude else ''}".strip()
    check = f'[ "$(cat /app/seen.txt)" = "{want}" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt'
    trial = _trial(alice, tmp_path, COMMAND_RECIPE, test=check)
    trial_execute(trial_id=trial.id)
    trial.refresh_from_db()
    assert trial.status == "succeeded", (trial.error_type, trial.error_message)
    assert trial.reward == 1.0, trial.rewards
    cred = ModelCredential.objects.get(trial_id=trial.id)
    assert cred.route == ROUTE and cred.revoked_at is not None
    # Revoked when the agent phase ended, before the verifier started.
    agent_end = datetime.fromisoformat(trial.timings["agent_execution"]["finished_at"])
    verifier_start = datetime.fromisoformat(trial.timings["verifier"]["started_at"])
    assert agent_end <= cred.revoked_at <= verifier_start, (agent_end, cred.revoked_at, verifier_start)
    # The plan that was launched names the model, never the secret.
    text = object_read(obj=trial.artifacts.get(name="launch-plan.json").object).decode()
    assert '"route":"qwen3-unit"' in text.replace(" ", "") and "synm_" not in text


def test_a_private_executable_is_staged_once_and_superseded_copies_are_pruned(tmp_path, monkeypatch):
    import os
    import time

    from apps.trials.model_access import staged_for_sandbox

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    exe = private / "claude"
    exe.write_bytes(b"\x7fELF v1")
    first = staged_for_sandbox(path=exe)
    assert first != exe and first.read_bytes() == b"\x7fELF v1" and first.stat().st_mode & 0o777 == 0o755
    assert staged_for_sandbox(path=exe) == first  # reused while unchanged

    exe.write_bytes(b"\x7fELF v2, a new release")  # the installed executable changed
    os.utime(first.parent, (time.time() - 7200, time.time() - 7200))  # the old copy idles
    second = staged_for_sandbox(path=exe)
    assert second != first and second.read_bytes() == b"\x7fELF v2, a new release"
    assert not first.parent.exists()  # superseded and idle: removed
    assert [p.name for p in (tmp_path / "tmp" / "synth-sandbox-bin").iterdir()] == [second.parent.name]
