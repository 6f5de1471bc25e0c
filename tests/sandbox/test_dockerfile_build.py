"""Dockerfiles applied in real Harbor trials on the local sandbox: COPY, WORKDIR, ENV and RUN
reach the agent and the verifier, a RUN's result is built once and then copied from the build
cache, a failing RUN ends the trial as an environment error, and Harbor's separate verifier
is built from the tests/Dockerfile that `harbor task init` writes."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial

from synth_sandbox import ENVIRONMENT_IMPORT_PATH
from synth_sandbox.paths import SANDBOX_PATH
from synth_sandbox.support import check_task_supported
from tests.sandbox.helpers import BASE_DIR, requires_sandbox, run

pytestmark = [requires_sandbox, pytest.mark.timeout(120)]

TASK_TOML = """\
schema_version = "1.4"

[task]
name = "synth-tests/dockerfile-build"

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 60.0

[environment]
memory_mb = 512
storage_mb = 256
"""
# The RUN records a random token: equal tokens in two trials mean the second one did not run it.
DOCKERFILE = """\
FROM ubuntu:24.04
ARG WHO=world
ENV GREETING="hello ${WHO}" TOOL_HOME=/srv/tool
WORKDIR /srv/work
COPY data/ ./input/
COPY note.txt /data/note.txt
RUN mkdir -p "$TOOL_HOME" \\
 && echo "built for $WHO" > "$TOOL_HOME/stamp" \\
 && head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n' > "$TOOL_HOME/token"
CMD ["bash"]
"""
TEST_SH = """\
#!/bin/bash
cp /srv/tool/token /logs/verifier/token.txt
echo "$GREETING" > /logs/verifier/greeting.txt
if [ "$(cat /srv/work/answer.txt)" = "hello world A note built for world" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
SOLVE_SH = """\
#!/bin/bash
set -euo pipefail
pwd > /logs/agent/pwd.txt
echo "$GREETING $(cat input/a.txt) $(cat /data/note.txt) $(cat "$TOOL_HOME/stamp")" > answer.txt
"""


def make_task(root: Path, *, dockerfile: str = DOCKERFILE) -> Path:
    task = root / "dockerfile-build"
    (task / "environment" / "data").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text(TASK_TOML)
    (task / "instruction.md").write_text("Write the greeting, the input and the note into answer.txt.\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "environment" / "data" / "a.txt").write_text("A\n")
    (task / "environment" / "note.txt").write_text("note\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    (task / "solution" / "solve.sh").write_text(SOLVE_SH)
    return task


@pytest.fixture
def roots() -> dict[str, Path]:
    base = BASE_DIR / f"build-{secrets.token_hex(4)}"
    return {"sandbox_root": base / "sandboxes", "build_cache_dir": base / "cache"}


def trial_config(task: Path, trials: Path, roots: dict[str, Path], env: dict[str, str] | None = None) -> TrialConfig:
    return TrialConfig(
        task=TaskConfig(path=task),
        trials_dir=trials,
        agent=AgentConfig(name="oracle"),
        environment=EnvironmentConfig(
            import_path=ENVIRONMENT_IMPORT_PATH,
            kwargs={key: str(value) for key, value in roots.items()},
            env=env or {},
        ),
    )


async def _trial(
    task: Path, trials: Path, roots: dict[str, Path], env: dict[str, str] | None = None
) -> tuple[object, str, Path]:
    trial = await Trial.create(trial_config(task, trials, roots, env))
    result = await trial.run()
    return result, trial.agent_environment.build_source, trials / result.trial_name  # type: ignore[attr-defined]


def test_dockerfile_is_applied_and_its_run_built_once(tmp_path: Path, roots: dict[str, Path]) -> None:
    task = make_task(tmp_path)
    assert check_task_supported(task) is None

    async def main() -> list[tuple[object, str, Path]]:
        # Three trials of the task at once: one builds, the others wait and copy its result.
        first = await asyncio.gather(*(_trial(task, tmp_path / "trials", roots) for _ in range(3)))
        later = await _trial(task, tmp_path / "trials", roots)
        return [*first, later]

    outcomes = run(main())
    tokens = set()
    for result, _source, trial_dir in outcomes:
        assert result.exception_info is None, result.exception_info  # type: ignore[attr-defined]
        assert result.verifier_result.rewards == {"reward": 1.0}  # type: ignore[attr-defined]
        assert (trial_dir / "agent" / "pwd.txt").read_text().strip() == "/srv/work"  # WORKDIR is the cwd
        assert (trial_dir / "verifier" / "greeting.txt").read_text().strip() == "hello world"  # ENV everywhere
        tokens.add((trial_dir / "verifier" / "token.txt").read_text())
    assert sorted(source for _, source, _ in outcomes) == ["built", "cache", "cache", "cache"]
    assert outcomes[-1][1] == "cache"
    assert len(tokens) == 1  # the RUN ran once
    assert len([p for p in roots["build_cache_dir"].iterdir() if p.is_dir()]) == 1
    assert not roots["sandbox_root"].exists() or not any(
        p.name != ".build-cache" for p in roots["sandbox_root"].iterdir()
    )


def test_a_dockerfile_without_run_is_applied_step_by_step(tmp_path: Path, roots: dict[str, Path]) -> None:
    dockerfile = DOCKERFILE.split("RUN ")[0] + "ENV PATH=/srv/tool/bin:$PATH LEVEL=image\n"
    task = make_task(tmp_path, dockerfile=dockerfile)
    (task / "solution" / "solve.sh").write_text(
        '#!/bin/bash\necho "$GREETING $(cat input/a.txt)" > answer.txt\necho "$PATH $LEVEL" > /logs/agent/env.txt\n'
    )
    (task / "tests" / "test.sh").write_text(
        '#!/bin/bash\n[ "$(cat /srv/work/answer.txt)" = "hello world A" ] && echo 1 > /logs/verifier/reward.txt'
        " || echo 0 > /logs/verifier/reward.txt\n"
    )
    # The trial's variables override the image's ENV, as in a container; a PATH the platform
    # made by prefixing the default one (Claude Code's directory) prefixes the image's PATH.
    trial_env = {"PATH": f"/synth/bin:{SANDBOX_PATH}", "LEVEL": "trial"}
    result, source, trial_dir = run(_trial(task, tmp_path / "trials", roots, trial_env))
    assert result.exception_info is None, result.exception_info  # type: ignore[attr-defined]
    assert result.verifier_result.rewards == {"reward": 1.0}  # type: ignore[attr-defined]
    assert source == "applied" and not roots["build_cache_dir"].exists()
    path, level = (trial_dir / "agent" / "env.txt").read_text().split()
    assert path == f"/synth/bin:/srv/tool/bin:{SANDBOX_PATH}" and level == "trial"


def test_a_failing_run_ends_the_trial_as_an_environment_error(tmp_path: Path, roots: dict[str, Path]) -> None:
    dockerfile = "FROM ubuntu:24.04\nWORKDIR /app\nRUN echo about to write into /usr && touch /usr/local/bin/tool\n"
    task = make_task(tmp_path, dockerfile=dockerfile)
    result, _source, _trial_dir = run(_trial(task, tmp_path / "trials", roots))
    info = result.exception_info  # type: ignore[attr-defined]
    assert info is not None and info.exception_type == "SandboxBuildFailedError"
    message = info.exception_message
    assert "environment/Dockerfile line 3 (RUN echo about to write into /usr && touch /usr/local/bin/tool)" in message
    assert "exited with status 1" in message
    assert "about to write into /usr" in message and "Read-only file system" in message
    assert result.verifier_result is None  # type: ignore[attr-defined]  # never a reward
    assert not [p for p in roots["build_cache_dir"].iterdir() if p.is_dir()]  # nothing cached


def test_separate_verifier_is_built_from_the_template_tests_dockerfile(tmp_path: Path, roots: dict[str, Path]) -> None:
    harbor = Path(sys.executable).parent / "harbor"
    subprocess.run(
        [str(harbor), "task", "init", "synth-tests/separate", "--no-pytest", "-p", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    task = tmp_path / "separate"
    assert "COPY . /tests/" in (task / "tests" / "Dockerfile").read_text()
    config = (task / "task.toml").read_text()
    assert 'environment_mode = "separate"' in config
    (task / "task.toml").write_text(config.replace("artifacts = []", 'artifacts = ["/app/hello.txt"]'))
    (task / "instruction.md").write_text("Write hello into /app/hello.txt.\n")
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello > /app/hello.txt\n")
    (task / "tests" / "expected.txt").write_text("hello\n")
    # Left out of the build context: an upload of tests/ would bring it, the build does not.
    (task / "tests" / "NOTES.md").write_text("for the task's authors\n")
    (task / "tests" / ".dockerignore").write_text("*.md\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        "ls /tests > /logs/verifier/tests-listing.txt\n"
        'if [ "$(cat /app/hello.txt)" = "$(cat /tests/expected.txt)" ]; then echo 1 > /logs/verifier/reward.txt;'
        " else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    assert check_task_supported(task) is None

    result, _source, trial_dir = run(_trial(task, tmp_path / "trials", roots))
    assert result.exception_info is None, result.exception_info  # type: ignore[attr-defined]
    assert result.verifier_result.rewards == {"reward": 1.0}  # type: ignore[attr-defined]
    # The verifier's /tests came from its own build (COPY . /tests/), not from an upload.
    listing = (trial_dir / "verifier" / "tests-listing.txt").read_text().split()
    assert listing == ["Dockerfile", "expected.txt", "test.sh"]  # ls hides .dockerignore; NOTES.md is not there


def test_copy_and_add_follow_docker_rules(tmp_path: Path) -> None:
    import io
    import tarfile

    from synth_sandbox.build import apply_build, prepare_build
    from synth_sandbox.paths import DEFAULT_HOST_DIRS, DEFAULT_WRITABLE_DIRS
    from tests.sandbox.helpers import started_sandbox

    context = tmp_path / "environment"
    (context / "src" / "pkg").mkdir(parents=True)
    (context / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (context / "src" / "main.py").write_text("print(1)\n")
    (context / "src" / "link.py").symlink_to("main.py")
    (context / "src" / "debug.log").write_text("excluded\n")
    (context / ".dockerignore").write_text("**/*.log\n")
    (context / "a.txt").write_text("a\n")
    (context / "b.txt").write_text("b\n")
    with tarfile.open(context / "bundle.tar.gz", "w:gz") as tar:
        data = b"from the archive\n"
        info = tarfile.TarInfo("bundle/inside.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (context / "Dockerfile").write_text(
        "FROM ubuntu:24.04\n"
        "WORKDIR /app\n"
        "COPY src/ ./\n"  # a directory's contents
        "COPY a.txt renamed.txt\n"  # a file to a file, relative to WORKDIR
        "COPY *.txt /data/texts/\n"  # a glob into a directory
        "COPY --chmod=700 a.txt /data/private\n"
        "RUN ln -s /etc /app/escape\n"  # a symlink planted by a RUN ...
        "COPY b.txt /app/escape/\n"  # ... is replaced, never followed on the host
        "ADD bundle.tar.gz /opt2/\n"  # a local archive is unpacked
        "COPY bundle.tar.gz /keep/\n"  # COPY never unpacks
    )
    build = prepare_build(environment_dir=context, writable_dirs=DEFAULT_WRITABLE_DIRS, host_dirs=DEFAULT_HOST_DIRS)
    assert build is not None and build.problems == []

    async def main() -> dict[str, str]:
        async with started_sandbox(workdir="/app", extra_writable_dirs=build.writable_dirs) as sandbox:
            await apply_build(sandbox=sandbox, build=build)
            out = {}
            for name, command in {
                "app": "cd /app && find . -mindepth 1 | sort | tr '\\n' ' '",
                "renamed": "cat /app/renamed.txt",
                "texts": "ls /data/texts | tr '\\n' ' '",
                "mode": "stat -c %a /data/private",
                "escape": "readlink /app/escape || echo not-a-link; ls /app/escape",
                "archive": "cat /opt2/bundle/inside.txt",
                "kept": "ls /keep",
                "link": "readlink /app/link.py",
            }.items():
                result = await sandbox.exec(command)
                out[name] = result.stdout.strip()
            return out

    out = run(main())
    assert out["app"].split() == [
        "./escape",
        "./escape/b.txt",
        "./link.py",
        "./main.py",
        "./pkg",
        "./pkg/mod.py",
        "./renamed.txt",
    ]
    assert out["renamed"] == "a" and out["texts"].split() == ["a.txt", "b.txt"] and out["mode"] == "700"
    assert out["escape"] == "not-a-link\nb.txt" and not Path("/etc/b.txt").exists()
    assert out["archive"] == "from the archive" and out["kept"] == "bundle.tar.gz" and out["link"] == "main.py"


def test_a_verifier_image_that_bundles_the_tests_is_refused(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    with (task / "task.toml").open("a") as toml:
        toml.write('\n[verifier.environment]\ndocker_image = "python:3.12-slim"\n')
    message = check_task_supported(task)
    assert message is not None and "prebuilt image 'python:3.12-slim' that bundles the tests" in message
