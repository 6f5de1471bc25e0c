"""The boundary between a Harbor trial's agent phase and its verification.

A reward must mean what it says. When the agent phase ends (the agent exits, times out or is
cancelled), before anything is verified:

1. every process the agent started is killed, whatever it did to escape (the local sandbox
   searches its PID namespace and its exec cgroups; another Harbor environment gets ``kill -9
   -1`` as root), so nothing the agent left running can touch the tests or the reward files;
2. the attempt's model credential is revoked (``on_agent_end``), not merely left to expire;
3. ``/tests`` and ``/logs/verifier`` are emptied, so that the verifier finds only what it
   brings itself (Harbor uploads the tests after this point);
4. for the task's own tests (not a judge) the verifier phase is *checked*: the names it looks
   up (a sandbox has no network) and the commands bash cannot find are recorded, and a
   verification that needed either is a verifier error, never a reward.

Harbor's own verifier failures (no reward file, an unparsable one, a timeout) are verifier
errors too. :meth:`TrialBoundary.verifier_failure` says which, with the last lines of the
verifier's output; the caller records it instead of the rewards.

Used by the trials worker (apps.trials.pipeline) and by ``synth agent run``; Django-free.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harbor.models.task.verifier_mode import VerifierEnvironmentMode, resolve_task_verifier_mode
from harbor.models.trial.paths import EnvironmentPaths
from harbor.trial.hooks import TrialEvent, TrialHookEvent

from synth_sandbox.environment import (
    LocalSandboxEnvironment,
    Phase,
    trial_forget,
    trial_observations,
    trial_phase_set,
)

logger = logging.getLogger(__name__)

# The error type a trial records when verifier_failure says why its verification does not
# count (the control plane's summaries count trials by it).
VERIFIER_ERROR = "VerifierError"
# Harbor's exceptions for a verification that produced no usable reward.
VERIFIER_EXCEPTIONS = frozenset(
    {
        "RewardFileNotFoundError",
        "RewardFileEmptyError",
        "VerifierOutputParseError",
        "VerifierTimeoutError",
        "AddTestsDirError",
        "DownloadVerifierDirError",
    }
)
_TAIL_LINES = 20
_TAIL_CHARS = 3000
_OUTPUT_MAX_BYTES = 1 << 20
# A POSIX shell's report of a missing command in a test script (dash, or bash without the hook).
_NOT_FOUND = re.compile(r"^/tests/\S+: (?:line )?\d+: (\S+): (?:command )?not found$", re.MULTILINE)
# `python -m TOOL` without TOOL installed (not an ImportError of the agent's code, which a
# traceback reports as ModuleNotFoundError).
_NO_MODULE = re.compile(r"^\S*python[\d.]*: No module named (\S+)$", re.MULTILINE)
# Run as root in a non-local environment: every process but the shell and PID 1.
_KILL_ALL = "kill -KILL -1 2>/dev/null; true"


@dataclass
class TrialBoundary:
    """Installed on one Harbor trial; see the module docstring."""

    trial: Any  # harbor.trial.trial.Trial
    check_verifier: bool
    on_agent_end: Callable[[], None] | None = None
    killed: int | None = None  # processes the agent left behind (None: the phase never ended)

    @property
    def trial_dir(self) -> Path:
        return Path(self.trial.paths.trial_dir)

    async def _agent_end(self, _event: TrialHookEvent) -> None:
        env = self.trial.agent_environment
        try:
            if isinstance(env, LocalSandboxEnvironment):
                self.killed = await env.end_processes()
            else:
                await env.exec(_KILL_ALL, user="root")
                self.killed = 0
        finally:
            # Even when the kill failed (the trial then fails): the agent's credential goes.
            if self.on_agent_end is not None:
                await asyncio.to_thread(self.on_agent_end)
        if self.killed:
            logger.info("trial %s: killed %d processes left by the agent", self.trial.config.trial_name, self.killed)

    async def _verification_start(self, _event: TrialHookEvent) -> None:
        phase = Phase(name="verifier", checked=self.check_verifier)
        trial_phase_set(trial_dir=self.trial_dir, phase=phase)  # a separate verifier env starts in it
        if resolve_task_verifier_mode(self.trial.task.config) != VerifierEnvironmentMode.SHARED:
            return
        env = self.trial.agent_environment
        if isinstance(env, LocalSandboxEnvironment):
            await env.phase_begin(phase)
        paths = EnvironmentPaths.for_os(env.os)
        await env.empty_dirs([paths.tests_dir, paths.verifier_dir], chmod=True)

    def verifier_failure(self, *, result: Any) -> str | None:
        """Why the trial's verification gave no reward to credit (None: its rewards stand)."""
        info = result.exception_info
        if info is not None and info.exception_type in VERIFIER_EXCEPTIONS:
            return _with_tail(f"{info.exception_type}: {info.exception_message}", self.trial_dir)
        if result.verifier_result is None or not self.check_verifier:
            return None
        seen = trial_observations(trial_dir=self.trial_dir, phase="verifier")
        output = _verifier_output(self.trial_dir)
        modules = [f"python -m {m}" for m in _NO_MODULE.findall(output)]
        missing = list(dict.fromkeys([*seen.missing_commands, *_NOT_FOUND.findall(output), *modules]))
        causes = []
        if seen.network:
            causes.append(
                f"tried to reach the network ({', '.join(seen.network[:5])}), which the sandbox does not have"
            )
        if missing:
            causes.append(f"ran commands this environment does not have ({', '.join(missing[:5])})")
        if not causes:
            return None
        rewards = result.verifier_result.rewards
        return _with_tail(f"the verifier {', and '.join(causes)}; its reward {rewards} is not credited", self.trial_dir)

    def close(self) -> None:
        trial_forget(trial_dir=self.trial_dir)


def trial_boundary_install(
    *, trial: Any, check_verifier: bool = True, on_agent_end: Callable[[], None] | None = None
) -> TrialBoundary:
    """Hook the boundary into a Harbor trial (``await Trial.create(config)``) before it runs.

    ``check_verifier``: the verifier is the task's own tests (a judge agent may look names up
    or probe for tools as part of its work). ``on_agent_end`` runs in a thread when the agent
    phase has ended (the worker revokes the attempt's credential there).
    """
    boundary = TrialBoundary(trial=trial, check_verifier=check_verifier, on_agent_end=on_agent_end)
    trial.add_hook(TrialEvent.AGENT_END, boundary._agent_end)
    trial.add_hook(TrialEvent.VERIFICATION_START, boundary._verification_start)
    return boundary


def _verifier_output(trial_dir: Path) -> str:
    path = trial_dir / "verifier" / "test-stdout.txt"
    with contextlib.suppress(OSError):
        with open(path, "rb") as f:
            size = path.stat().st_size
            f.seek(max(0, size - _OUTPUT_MAX_BYTES))
            return f.read().decode(errors="replace")
    return ""


def _with_tail(message: str, trial_dir: Path) -> str:
    lines = _verifier_output(trial_dir).rstrip().splitlines()[-_TAIL_LINES:]
    tail = "\n".join(lines)[-_TAIL_CHARS:]
    return f"{message}\nlast lines of the verifier's output:\n{tail}" if tail else message


# ------------------------------------------------------------------ repository history

# Run in the environment before the agent: each git repository under the given roots keeps its
# checked-out HEAD and the history behind it, and loses everything else a solution could be
# read from: remotes, other branches, tags, stashes, notes, reflogs, and the objects only those
# reached (for instance the commits after HEAD on its own branch).
GIT_SANITIZE_SCRIPT = r"""
set -u
command -v git >/dev/null 2>&1 || { echo "sanitize_git: git is not installed" >&2; exit 0; }
# Repositories may belong to another user than the one running this; no global config is written.
g() { git -c safe.directory='*' "$@"; }
for root in "$@"; do
  [ -d "$root" ] || continue
  find "$root" -xdev -type d -name .git -prune -print 2>/dev/null | while IFS= read -r gitdir; do
    repo=$(dirname "$gitdir")
    export GIT_DIR="$gitdir" GIT_WORK_TREE="$repo"
    head=$(g rev-parse --verify -q HEAD) || { echo "sanitize_git: $repo has no HEAD" >&2; continue; }
    branch=$(g symbolic-ref -q --short HEAD || true)
    for remote in $(g remote); do g remote remove "$remote"; done
    g for-each-ref --format='%(refname)' | while IFS= read -r ref; do
      [ -n "$branch" ] && [ "$ref" = "refs/heads/$branch" ] && continue
      g update-ref -d "$ref"
    done
    [ -n "$branch" ] && g update-ref "refs/heads/$branch" "$head"
    rm -f "$gitdir"/ORIG_HEAD "$gitdir"/FETCH_HEAD "$gitdir"/MERGE_HEAD "$gitdir"/CHERRY_PICK_HEAD "$gitdir"/packed-refs.lock
    rm -rf "$gitdir"/logs "$gitdir"/refs/original "$gitdir"/shallow.lock
    g reflog expire --expire=now --all 2>/dev/null
    g -c gc.reflogExpire=now -c gc.reflogExpireUnreachable=now -c gc.pruneExpire=now gc --prune=now --quiet
    echo "sanitize_git: $repo kept $(g rev-list --count HEAD) commits up to ${head}"
  done
done
"""


# ------------------------------------------------------------------ fresh verification


def task_verifier_fresh(*, task_dir: Path) -> None:
    """Make a (materialized, private) task verify in a fresh environment of its own: Harbor's
    separate verifier mode, built from the task's environment definition. The agent's
    environment, and every process and file it left there outside what is handed over (its
    declared artifacts, and the workdir: see apps.trials.harbor_config), is gone before the tests run."""
    from harbor.models.task.config import TaskConfig

    path = task_dir / "task.toml"
    config = TaskConfig.model_validate_toml(path.read_text())
    if config.verifier.environment_mode == VerifierEnvironmentMode.SEPARATE:
        return
    config.verifier.environment_mode = VerifierEnvironmentMode.SEPARATE
    path.write_text(config.model_dump_toml())
