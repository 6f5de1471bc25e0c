"""Model access for one trial: the route, a scoped credential, the bridge and the harness.

When the actor recipe binds a model (``{"route": NAME}``), the trials worker, before the
sandbox starts:

1. resolves the route (the proxy's ModelRoute, read through a lazy import: the proxy is a
   service the worker talks to, not a dependency of the runs models);
2. checks that the environment has a model bridge (the local sandbox) and that the proxy
   listens on ``SYNTH_PROXY_SOCKET``;
3. issues a credential scoped to (org, run, trial, route, snapshot) that expires after the
   trial's agent deadline plus a margin (``model_credential_issue``).

What the recipe's engine needs (whether it uses a model, which host executable it must
have, its deadlines) comes from the launcher (``launch_needs``, the engine registry), not
from reading the recipe here. The launcher gets ``ModelBinding(name=<route>,
base_url=http://127.0.0.1:<port>)`` and the secret (``Bindings.credential``); the sandbox gets
``model_socket`` (the bridge from its own 127.0.0.1:<port> to the proxy's Unix socket), the
harness executables that are installed (the engine registry's ``HOST_BINARIES``: Claude
Code at ``/synth/bin/claude``, Codex at ``/synth/bin/codex``) bound read-only with
``/synth/bin`` first on PATH (the engine's own is required), and the engine's harness tree
if it has one (mini-swe-agent's venv at ``/synth/mini-swe-agent``, apps.trials.harnesses),
bound read-only off PATH. When the trial ends, however it ends, the worker revokes the
credential (:func:`model_access_close`).

A failure here (unknown route, an unresolved checkpoint binding, no bridge, proxy down, the
engine's harness not installed) is a :class:`ModelAccessError`: the trial fails with its
message before any sandbox exists.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import posixpath
import shutil
import socket
import stat
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from apps.accounts.models import ModelCredential
from apps.accounts.services import model_credential_issue, model_credential_revoke
from synth_launcher.engines import CLAUDE_CODE_BINARY, HOST_BINARIES, HostBinary
from synth_launcher.launcher import LaunchError, LaunchNeeds, ModelBinding, launch_needs

if TYPE_CHECKING:
    from apps.runs.models import Trial

# Inside the sandbox: where the host's harness executables are bound (the engine registry's).
SANDBOX_CLAUDE = CLAUDE_CODE_BINARY.target
SANDBOX_BIN_DIR = posixpath.dirname(SANDBOX_CLAUDE)
assert all(posixpath.dirname(binary.target) == SANDBOX_BIN_DIR for binary in HOST_BINARIES)
_ELF_MAGIC = b"\x7fELF"


class ModelAccessError(RuntimeError):
    """The trial cannot be given model access; ``message`` says why and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class ModelAccess:
    """What one trial holds: the binding the launcher sees, the credential, the bridge."""

    binding: ModelBinding
    credential: ModelCredential
    secret: str = field(repr=False)
    socket: Path
    port: int
    # (host path, path inside the sandbox) of each harness executable to bind read-only.
    binds: tuple[tuple[Path, str], ...] = ()
    harness_binds: tuple[str, ...] = ()  # "host:target" of the engine's harness tree (apps.trials.harnesses)


# ---------------------------------------------------------------- reads


def trial_model_binding(*, trial: Trial) -> dict[str, Any]:
    """The trial's model binding: its group's sampler (fixed when the group was made), else the spec's."""
    return dict(trial.group.sampler or trial.run.spec.model_binding or {})


def model_route_get(*, name: str) -> Any:
    """The proxy's ModelRoute called ``name`` (exact name, not an alias), or None."""
    from apps.proxy.models import ModelRoute  # lazy: runs' models do not depend on the proxy

    return ModelRoute.objects.filter(name=name).first()


def environment_import_path(*, plan: dict[str, Any]) -> str | None:
    """The Harbor environment class a plan runs in (None for a named provider: docker, modal ...)."""
    from synth_sandbox import environment_path_current

    name = plan.get("environment") or "local"
    if name == "local":
        name = settings.SYNTH_DEFAULT_ENVIRONMENT
    return environment_path_current(name) if ":" in name else None


def environment_has_model_bridge(*, plan: dict[str, Any]) -> bool:
    """Whether the plan's environment is the local sandbox (or a subclass): the one with a bridge."""
    from synth_sandbox.environment import LocalSandboxEnvironment

    path = environment_import_path(plan=plan)
    if path is None:
        return False
    module, _, attr = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return False
    return isinstance(cls, type) and issubclass(cls, LocalSandboxEnvironment)


def proxy_listening(*, path: Path, timeout: float = 2.0) -> bool:
    """Whether something accepts connections on the Unix socket ``path``."""
    try:
        if not stat.S_ISSOCK(path.stat().st_mode):
            return False
    except OSError:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def _readable_by_others(path: Path) -> str | None:
    """None when the sandbox's unprivileged uid can reach and run ``path``; else the obstacle."""
    mode = path.stat().st_mode
    if mode & 0o005 != 0o005:
        return f"{path} is not readable and executable by other users (mode {stat.filemode(mode)})"
    for parent in path.parents:
        if parent.stat().st_mode & 0o001 == 0:
            return f"{parent} is not searchable by other users"
    return None


def host_binary_path(*, binary: HostBinary) -> Path | None:
    """The host's executable of ``binary`` to bind into sandboxes (resolved), or None if absent.

    Its setting (``SYNTH_CLAUDE_CODE_BIN``, ``SYNTH_CODEX_SANDBOX_BIN``) defaults to the repository's
    node_modules, where ``npm ci`` installs the pinned packages' native executables.
    """
    configured = Path(getattr(settings, binary.setting))
    if not configured.exists():
        return None
    return configured.resolve()


def claude_code_binary() -> Path | None:
    """The host's Claude Code executable (``SYNTH_CLAUDE_CODE_BIN``), or None if absent."""
    return host_binary_path(binary=CLAUDE_CODE_BINARY)


def staged_for_sandbox(*, path: Path) -> Path:
    """``path``, or a world-readable copy of it when the sandbox's uid cannot reach it.

    The sandbox binds the executable while running as an unprivileged uid, so every
    directory above the file must be searchable by others. A checkout inside a private
    directory (mode 0700, as ``mktemp -d`` makes) is not; rather than ask operators to
    loosen their home or CI directories, copy the file once into the system temp dir
    (keyed by path, size and mtime; written aside and renamed, so concurrent workers agree).
    """
    if _readable_by_others(path) is None:
        return path
    info = path.stat()
    key = hashlib.sha256(f"{path}:{info.st_size}:{info.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "synth-sandbox-bin" / key
    target = folder / path.name
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        for directory in (folder.parent, folder):
            directory.chmod(0o755)
        partial = folder / f".{path.name}.{os.getpid()}.part"
        shutil.copyfile(path, partial)
        partial.chmod(0o755)
        (folder / STAGED_SOURCE).write_text(str(path))
        os.replace(partial, target)
        staged_prune(root=folder.parent, keep=folder)
    else:
        os.utime(folder)  # in use: not to be pruned
    return target


STAGED_SOURCE = ".source"


def staged_prune(*, root: Path, keep: Path, idle_seconds: float = 3600.0) -> list[Path]:
    """Remove staged copies that are superseded (same source, another size or mtime) or
    orphaned (their source is gone) and idle for ``idle_seconds``: each is a whole Claude
    Code executable (~200 MB). Copies still used are touched on every use."""
    removed = []
    now = time.time()
    for folder in root.iterdir():
        if folder == keep or not (folder / STAGED_SOURCE).is_file():
            continue
        source = Path((folder / STAGED_SOURCE).read_text())
        superseded = source == Path((keep / STAGED_SOURCE).read_text()) or not source.exists()
        if superseded and now - folder.stat().st_mtime >= idle_seconds:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def host_binary_check(*, binary: HostBinary, path: Path) -> None:
    """Raise ModelAccessError unless ``path`` (``binary``'s executable) can run inside a sandbox."""
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != _ELF_MAGIC:
        raise ModelAccessError(
            f"{binary.label} at {path} is not a native executable (did its npm install complete? "
            "`npm ci` in the repository root installs it); the sandbox binds one file and has no node_modules"
        )
    problem = _readable_by_others(staged_for_sandbox(path=path))
    if problem:
        raise ModelAccessError(
            f"{binary.label} cannot be bound into the sandbox, whose uid is unprivileged: {problem}. "
            f"Install the repository where other users can read it, or set {binary.setting}"
        )


def claude_code_check(*, path: Path) -> None:
    """Raise ModelAccessError unless Claude Code at ``path`` can run inside a sandbox."""
    host_binary_check(binary=CLAUDE_CODE_BINARY, path=path)


def host_binaries_bind(*, required: HostBinary | None) -> tuple[tuple[Path, str], ...]:
    """(host path, sandbox path) of every installed harness executable that can be bound;
    ModelAccessError when ``required`` (the engine's own) is missing or cannot be bound."""
    binds = []
    for binary in HOST_BINARIES:
        path = host_binary_path(binary=binary)
        if path is None:
            if binary == required:
                raise ModelAccessError(
                    f"{binary.label} is not installed at {getattr(settings, binary.setting)} ({binary.setting}); "
                    "run `npm ci` in the repository root (deploy/setup.sh does)"
                )
            continue
        try:
            host_binary_check(binary=binary, path=path)
        except ModelAccessError:
            if binary == required:
                raise
            continue  # another engine does not need it
        binds.append((staged_for_sandbox(path=path), binary.target))
    return tuple(binds)


def credential_ttl(*, needs: LaunchNeeds, plan: dict[str, Any]) -> timedelta:
    """How long a trial's credential lives: the agent's deadline as the trial applies it
    (the launch's, i.e. the recipe's limit capped by the task's, or the plan's override,
    times the plan's multiplier), plus every setup command's deadline, plus the configured margin."""
    agent = needs.agent_timeout_sec
    if plan.get("agent_timeout_sec"):
        agent = float(plan["agent_timeout_sec"])
    agent *= float(plan.get("timeout_multiplier") or 1.0)
    return timedelta(seconds=agent + needs.setup_budget_sec + settings.SYNTH_MODEL_CREDENTIAL_MARGIN_SECONDS)


def attempt_sampling(*, plan: dict[str, Any], trial: Trial) -> dict[str, Any]:
    """What the proxy holds this attempt's calls to: the plan's ``sampling`` (temperature,
    top_p, top_k, max_tokens as a cap), and with ``sampling.seed`` this attempt's own seed.

    The attempt's seed is drawn from the plan's, the group's step and task position and the
    attempt's number, never from ids: a rerun of the same plan on the same dataset gives each
    attempt the same seed, and two attempts of one group never share one (the proxy then
    draws each call's seed from it and the prompt, apps.proxy.calls.call_sampling).
    """
    held = dict(plan.get("sampling") or {})
    if held.get("seed") is not None:
        place = f"{held['seed']}/{trial.group.step}/{trial.group.position}/{trial.attempt}"
        held["seed"] = int.from_bytes(hashlib.sha256(place.encode()).digest()[:8], "little") >> 2
    return held


# ---------------------------------------------------------------- writes


def model_access_open(
    *, trial: Trial, recipe: dict[str, Any], binding: dict[str, Any] | None = None, role: str = "actor"
) -> ModelAccess | None:
    """Model access for ``trial``, or None when its recipe binds no model (or needs none).

    ``binding`` defaults to the trial's (its group's sampler); a judge passes its own, with
    ``role="judge"``, so that its calls are told apart from the attempt's.
    Checks everything before issuing the credential, so a refusal leaves nothing behind.
    """
    try:
        needs = launch_needs(recipe=recipe, task_agent_timeout_sec=trial.task_version.agent_timeout_sec)
    except LaunchError as exc:
        raise ModelAccessError(f"recipe: {exc.message}") from None
    engine = needs.engine
    if binding is None:
        binding = trial_model_binding(trial=trial)
    if not binding or not engine.uses_model:
        return None
    if binding.get("checkpoint") and not binding.get("snapshot"):
        # Pinned bindings of checkpoints carry their route and snapshot (apps.runs.bindings).
        raise ModelAccessError(f"the checkpoint binding {binding!r} was not resolved to a route and snapshot")
    route_name = binding.get("route")
    if not route_name:
        raise ModelAccessError(f"the model binding {binding!r} names no route")
    route = model_route_get(name=route_name)
    if route is None:
        raise ModelAccessError(
            f"model route {route_name!r} does not exist; create it with "
            f"`manage.py route_add {route_name} ...` (or route_add --default for qwen3-8b)"
        )
    if not route.inference_enabled:
        raise ModelAccessError(f"model route {route_name!r} has inference disabled")
    plan = trial.run.spec.plan
    if not environment_has_model_bridge(plan=plan):
        raise ModelAccessError(
            f"environment {plan.get('environment')!r} has no model bridge; agents that use a model run in "
            "the local sandbox for now"
        )
    proxy_socket = Path(settings.SYNTH_PROXY_SOCKET)
    if not proxy_listening(path=proxy_socket):
        raise ModelAccessError(
            f"the model proxy is not listening on {proxy_socket} (SYNTH_PROXY_SOCKET); start it with "
            f"`uvicorn synth_project.proxy_asgi:application --uds {proxy_socket}`"
        )
    binds = host_binaries_bind(required=engine.host_binary)
    harness_binds: tuple[str, ...] = ()
    if engine.harness_tree is not None:
        from apps.trials.harnesses import HarnessUnavailable, harness_tree_resolve

        try:
            harness_binds = (f"{harness_tree_resolve(tree=engine.harness_tree)}:{engine.harness_tree.target}",)
        except HarnessUnavailable as exc:
            raise ModelAccessError(str(exc)) from None
    port = int(settings.SYNTH_SANDBOX_MODEL_PORT)
    cred, secret = model_credential_issue(
        org=trial.run.org,
        run_id=trial.run_id,
        trial_id=trial.id,
        route=route.name,
        snapshot=str(binding.get("snapshot") or ""),
        role=role,
        ttl=credential_ttl(needs=needs, plan=plan),
        # A judge keeps its own sampling: the plan's is the actor's, what the learner assumes.
        sampling=attempt_sampling(plan=plan, trial=trial) if role == "actor" else None,
    )
    return ModelAccess(
        binding=ModelBinding(name=route.name, base_url=f"http://127.0.0.1:{port}", route=route.name),
        credential=cred,
        secret=secret,
        socket=proxy_socket,
        port=port,
        binds=binds,
        harness_binds=harness_binds,
    )


def model_access_close(*, access: ModelAccess) -> None:
    """Revoke the trial's credential (idempotent): later calls with it are 401."""
    model_credential_revoke(cred=access.credential)


def sandbox_model_options(*, access: ModelAccess) -> tuple[dict[str, Any], dict[str, str]]:
    """(LocalSandboxEnvironment kwargs, persistent env) that give a sandbox the model bridge
    and the installed harnesses (``claude``, ``codex``) on PATH."""
    from synth_sandbox.sandbox import SANDBOX_PATH

    kwargs: dict[str, Any] = {
        "model_socket": str(access.socket),
        "model_port": access.port,
        "model_max_connections": settings.SYNTH_SANDBOX_MODEL_MAX_CONNECTIONS,
    }
    env: dict[str, str] = {}
    binds = list(access.harness_binds)  # off PATH: a harness's python must not shadow the task's
    if access.binds:
        binds += [f"{host}:{target}" for host, target in access.binds]
        env["PATH"] = f"{SANDBOX_BIN_DIR}:{SANDBOX_PATH}"
    if binds:
        kwargs["extra_ro_binds"] = binds
    return kwargs, env
