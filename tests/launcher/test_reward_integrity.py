"""A reward means what it says: real Harbor trials in the local sandbox, with and without the
agent/verification boundary (synth_sandbox.boundary).

Each cheating technique is first shown to work against a bare Harbor trial (the control: the
do-nothing attempt scores 1), then to score 0 once the boundary is installed. Verifications
that need what the sandbox lacks (the network, a tool) or write no reward are verifier errors;
an honest one keeps its reward. Repository history can be sanitized before the agent starts,
and a fresh verifier sees only the workdir.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from synth_launcher.harbor_agent import recipe_agent_config
from synth_launcher.launcher import AttemptBinding, Bindings, RunBinding, TaskBinding, launch_plan_build
from synth_sandbox.boundary import TrialBoundary, task_verifier_fresh, trial_boundary_install
from tests.cheats import TECHNIQUES, cheating_recipe

ROOT = Path(__file__).resolve().parents[2]
ROMAN = ROOT / "examples/tasks/implement-roman"
ENVIRONMENT = "synth_sandbox.environment:LocalSandboxEnvironment"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@dataclass
class Attempt:
    result: Any
    failure: str | None
    boundary: TrialBoundary | None
    trial_dir: Path

    @property
    def reward(self) -> float | None:
        rewards = self.result.verifier_result.rewards if self.result.verifier_result else None
        return rewards.get("reward") if rewards else None


async def attempt(
    *,
    task_dir: Path,
    trials_dir: Path,
    recipe: dict[str, Any],
    boundary: bool = True,
    artifacts: list[dict[str, Any]] | None = None,
    agent_kwargs: dict[str, Any] | None = None,
) -> Attempt:
    from harbor.models.task.task import Task
    from harbor.models.trial.config import EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    task = Task(task_dir)
    bindings = Bindings(
        task=TaskBinding(
            name=task.name,
            workdir=task.config.environment.workdir or "/app",
            instruction=task.instruction,
            agent_timeout_sec=60,
        ),
        run=RunBinding(id="run_test", kind="evaluate"),
        attempt=AttemptBinding(trial_id=f"trl_{uuid.uuid4().hex[:10]}", index=0),
    )
    plan = launch_plan_build(recipe=recipe, bindings=bindings)
    agent = recipe_agent_config(plan=plan, task_dir=task_dir)
    agent.kwargs.update(agent_kwargs or {})
    config = TrialConfig(
        task=TaskConfig(path=task_dir),
        trial_name=plan.correlation_id,
        trials_dir=trials_dir,
        agent=agent,
        environment=EnvironmentConfig(import_path=ENVIRONMENT),
        artifacts=artifacts or [],
    )
    trial = await Trial.create(config)
    installed = trial_boundary_install(trial=trial) if boundary else None
    try:
        result = await trial.run()
        failure = installed.verifier_failure(result=result) if installed else None
    finally:
        if installed:
            installed.close()
    return Attempt(result=result, failure=failure, boundary=installed, trial_dir=trials_dir / plan.correlation_id)


def run_all(**attempts: dict[str, Any]) -> dict[str, Attempt]:
    """Independent attempts at once (keeps the module short on two cores)."""

    async def main() -> dict[str, Attempt]:
        done = await asyncio.gather(*(attempt(**kwargs) for kwargs in attempts.values()))
        return dict(zip(attempts, done, strict=True))

    return asyncio.run(main())


@pytest.fixture(scope="module")
def cheats(tmp_path_factory) -> dict[str, Attempt]:
    trials = tmp_path_factory.mktemp("cheat-trials")
    runs: dict[str, dict[str, Any]] = {}
    for technique in TECHNIQUES:
        recipe = cheating_recipe(technique)
        runs[f"{technique}/bare"] = {"task_dir": ROMAN, "trials_dir": trials, "recipe": recipe, "boundary": False}
        runs[f"{technique}/guarded"] = {"task_dir": ROMAN, "trials_dir": trials, "recipe": recipe}
    return run_all(**runs)


@pytest.mark.parametrize("technique", TECHNIQUES)
def test_a_cheat_that_works_on_a_bare_trial_scores_zero_behind_the_boundary(cheats, technique):
    bare, guarded = cheats[f"{technique}/bare"], cheats[f"{technique}/guarded"]
    assert bare.reward == 1.0, "the control: without the boundary this technique is a reward hack"
    assert guarded.reward == 0.0 and guarded.failure is None, guarded.failure
    if technique != "plant":
        assert guarded.boundary is not None and guarded.boundary.killed >= 1


# ---------------------------------------------------------------- verifier errors


def _task(root: Path, name: str, *, test_sh: str, solve_sh: str = "#!/bin/bash\necho hello > /app/out.txt\n") -> Path:
    task = root / name
    for sub in ("environment", "tests", "solution"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text(
        f'schema_version = "1.4"\n[task]\nname = "synth/{name}"\n[verifier]\ntimeout_sec = 60.0\n'
        '[agent]\ntimeout_sec = 60.0\n[environment]\nworkdir = "/app"\n'
    )
    (task / "instruction.md").write_text("Write hello to /app/out.txt\n")
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (task / "tests" / "test.sh").write_text(test_sh)
    (task / "solution" / "solve.sh").write_text(solve_sh)
    return task


HONEST_TEST = (
    '#!/bin/bash\nif [ "$(cat /app/out.txt)" = hello ]; then echo 1 > /logs/verifier/reward.txt; '
    "else echo 0 > /logs/verifier/reward.txt; fi\n"
)
ORACLE = {"engine": {"name": "oracle", "version": "1"}, "limits": {"timeout_sec": 60}}


def _harbor_template(root: Path, *, mode: str) -> Path:
    """What `harbor task init` writes (with its pytest tests), with the blanks filled in."""
    subprocess.run(
        [str(ROOT / ".venv/bin/harbor"), "task", "init", "synth/templated", "-p", str(root), "--verifier-mode", mode],
        check=True,
        capture_output=True,
    )
    task = root / "templated"
    shutil.rmtree(task / "tests" / "__pycache__", ignore_errors=True)
    (task / "instruction.md").write_text("Write hello to /app/hello.txt\n")
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello > /app/hello.txt\n")
    (task / "tests" / "test_outputs.py").write_text(
        'def test_outputs():\n    assert open("/app/hello.txt").read().strip() == "hello"\n'
    )
    return task


@pytest.fixture(scope="module")
def verifications(tmp_path_factory) -> dict[str, Attempt]:
    root = tmp_path_factory.mktemp("verifier-tasks")
    trials = tmp_path_factory.mktemp("verifier-trials")
    tasks = {
        "honest": _task(root, "honest", test_sh=HONEST_TEST),
        # dash reports a missing command its own way (no bash hook).
        "missing-tool": _task(
            root,
            "missing-tool",
            test_sh="#!/bin/sh\nsynth-grader --strict /app/out.txt\necho 0 > /logs/verifier/reward.txt\n",
        ),
        "no-reward": _task(root, "no-reward", test_sh="#!/bin/bash\necho 'checking'; exit 3\n"),
        # The host's python has no pytest: the 0 would say nothing about the work.
        "missing-module": _task(
            root,
            "missing-module",
            test_sh="#!/bin/bash\npython3 -m pytest /tests && echo 1 > /logs/verifier/reward.txt "
            "|| echo 0 > /logs/verifier/reward.txt\n",
        ),
        # Harbor's shared-mode template installs its tools from the network.
        "network": _harbor_template(root, mode="shared"),
    }
    return run_all(**{name: {"task_dir": task, "trials_dir": trials, "recipe": ORACLE} for name, task in tasks.items()})


def test_an_honest_verification_keeps_its_reward(verifications):
    assert verifications["honest"].reward == 1.0 and verifications["honest"].failure is None


def test_a_verifier_that_needs_the_network_is_an_error_not_a_zero(verifications):
    failure = verifications["network"].failure
    assert failure is not None and "tried to reach the network" in failure and "astral.sh" in failure, failure
    assert "last lines of the verifier's output" in failure and "Could not resolve host" in failure


def test_a_verifier_missing_a_tool_or_a_reward_is_an_error(verifications):
    missing = verifications["missing-tool"].failure
    assert missing is not None and "synth-grader" in missing and verifications["missing-tool"].reward == 0.0
    module = verifications["missing-module"].failure
    assert module is not None and "python -m pytest" in module, module
    no_reward = verifications["no-reward"].failure
    assert no_reward is not None and no_reward.startswith("RewardFileNotFoundError") and "checking" in no_reward


# ---------------------------------------------------------------- history and fresh verification


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
        env={**env, "PATH": "/usr/bin:/bin"},
    ).stdout.strip()


def _repo_task(root: Path) -> tuple[Path, str]:
    """A task whose workdir is a repository checked out one commit before its fix, with the fix
    also on a tag, another branch and a remote-tracking ref."""
    task = _task(root, "history", test_sh=HONEST_TEST)
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\nCOPY app/ /app/\n")
    repo = task / "environment" / "app"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "code.py").write_text("BUG = True\n")
    _git(repo, "add", "code.py")
    _git(repo, "commit", "-qm", "start")
    (repo / "code.py").write_text("BUG = False\n")
    _git(repo, "commit", "-qam", "the fix")
    fix = _git(repo, "rev-parse", "HEAD")
    _git(repo, "tag", "fixed")
    _git(repo, "branch", "solution")
    _git(repo, "remote", "add", "origin", "https://example.invalid/repo.git")
    _git(repo, "update-ref", "refs/remotes/origin/main", fix)
    _git(repo, "checkout", "-q", "HEAD~1")
    return task, fix


def test_sanitized_history_has_nothing_after_head(tmp_path):
    task, fix = _repo_task(tmp_path / "tasks")
    probe = (
        f"git cat-file -e {fix} 2>/dev/null && echo found > /app/fix.txt || echo gone > /app/fix.txt; "
        "git log --all --oneline | wc -l > /app/commits.txt; git remote | wc -l > /app/remotes.txt; "
        "echo hello > /app/out.txt"
    )
    recipe = {**cheating_recipe(), "command": ["bash", "-c", probe]}
    artifacts = [{"source": "/app", "destination": "workdir"}]
    common = {"task_dir": task, "trials_dir": tmp_path / "trials", "recipe": recipe, "artifacts": artifacts}
    out = run_all(plain={**common}, sanitized={**common, "agent_kwargs": {"sanitize_git": True}})

    def read(name: str, which: str) -> str:
        return (out[which].trial_dir / "artifacts" / "workdir" / name).read_text().strip()

    assert (read("fix.txt", "plain"), read("remotes.txt", "plain")) == ("found", "1")  # the control
    assert read("fix.txt", "sanitized") == "gone"
    assert (read("commits.txt", "sanitized"), read("remotes.txt", "sanitized")) == ("1", "0")
    assert out["sanitized"].reward == 1.0


def test_a_fresh_verifier_sees_the_workdir_and_nothing_else(tmp_path):
    test_sh = (
        '#!/bin/bash\nif [ "$(cat /app/out.txt)" = hello ] && [ ! -e /tmp/planted ] && [ ! -e /root/planted ]; '
        "then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    shared = _task(tmp_path / "a", "fresh", test_sh=test_sh)
    fresh = _task(tmp_path / "b", "fresh", test_sh=test_sh)
    task_verifier_fresh(task_dir=fresh)
    work = "echo hello > /app/out.txt; touch /tmp/planted /root/planted"
    recipe = {**cheating_recipe("setsid"), "command": ["bash", "-c", work]}
    artifacts = [{"source": "/app", "destination": "workdir"}]
    out = run_all(
        shared={"task_dir": shared, "trials_dir": tmp_path / "t1", "recipe": recipe},
        fresh={"task_dir": fresh, "trials_dir": tmp_path / "t2", "recipe": recipe, "artifacts": artifacts},
    )
    assert out["shared"].reward == 0.0  # the control: the agent's other files are still there
    assert out["fresh"].reward == 1.0 and out["fresh"].failure is None, out["fresh"].result.exception_info


def test_tests_and_solution_are_out_of_reach_during_the_agent_phase(tmp_path):
    probe = (
        "{ ls -A /tests /solution; find / -path /proc -prune -o \\( -name solve.sh -o -name test_roman.py \\) -print; "
        "} > /app/seen.txt 2>/dev/null; true"
    )
    recipe = {**cheating_recipe(), "command": ["bash", "-c", probe]}
    (out,) = run_all(
        one={
            "task_dir": ROMAN,
            "trials_dir": tmp_path,
            "recipe": recipe,
            "artifacts": [{"source": "/app", "destination": "workdir"}],
        }
    ).values()
    seen = (out.trial_dir / "artifacts" / "workdir" / "seen.txt").read_text().split()
    assert sorted(seen) == ["/solution:", "/tests:"], seen  # both empty, and no copy anywhere else
    assert out.reward == 0.0


def test_the_harbor_templates_as_written(tmp_path):
    """`harbor task init` in shared mode, its blanks filled with a verifier that needs no
    network, reaches reward 1 with its solution (the separate mode: tests/sandbox/
    test_dockerfile_build.py); its pytest template for separate mode copies a tool from another
    image, which the local sandbox refuses by name before anything runs."""
    from synth_sandbox.support import check_task_supported

    shared = _harbor_template(tmp_path / "shared", mode="shared")
    (shared / "tests" / "test.sh").write_text(
        "#!/bin/bash\nif python3 -c 'import sys; sys.path[:0] = [\"/tests\"]; import test_outputs as t; t.test_outputs()';"
        " then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    (out,) = run_all(one={"task_dir": shared, "trials_dir": tmp_path / "trials", "recipe": ORACLE}).values()
    assert out.reward == 1.0 and out.failure is None, (out.failure, out.result.exception_info)
    separate = _harbor_template(tmp_path / "separate", mode="separate")
    problem = check_task_supported(separate)
    assert problem is not None and "COPY --from" in problem, problem
