"""What the local environment does on the host instead of spawning a command into the
sandbox, checked against that command: downloads that leave entries out (the matcher against
GNU tar itself, the copy against Harbor's tar path on the same sandbox) and emptying
directories before verification (against Harbor's command, symlinks never followed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from harbor.environments.base import BaseEnvironment

from synth_sandbox import hostfs
from synth_sandbox.files import tar_excluded
from tests.sandbox.helpers import requires_root, requires_sandbox, run
from tests.sandbox.test_environment import _environment
from tests.sandbox.test_harbor import make_task

FILES = [
    "a.txt",
    "top.txt",
    "sub/top.txt",
    ".git/config",
    ".git/objects/ab/cdef",
    "src/m.py",
    "src/__pycache__/m.cpython-312.pyc",
    "src/pkg/__pycache__/deep.pyc",
    "logs/run.log",
    "deep/x/y/z.log",
    "deep/x/y/z.txt",
    "build/out/bin",
    "build/keep",
    "other/build/out/bin2",
    "other/build/outside",
    "notgit/.gitignore",
]
PATTERNS = [".git", "__pycache__", "*.log", "build/out", "./top.txt", "y/"]


def _tree(root: Path) -> Path:
    for rel in FILES:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)
    return root


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _gnu_tar_keeps(tree: Path, patterns: list[str]) -> set[str]:
    """The regular files `tar --exclude=... -C tree .` archives (as Harbor runs it)."""
    packed = subprocess.run(
        ["tar", "cf", "-", *(f"--exclude={p}" for p in patterns), "-C", str(tree), "."],
        check=True,
        capture_output=True,
    ).stdout
    listed = subprocess.run(["tar", "tvf", "-"], input=packed, check=True, capture_output=True).stdout.decode()
    return {line.split()[-1].removeprefix("./") for line in listed.splitlines() if line.startswith("-")}


def test_excluded_entries_are_those_gnu_tar_leaves_out(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree")
    kept = _gnu_tar_keeps(tree, PATTERNS)
    assert "src/m.py" in kept and ".git/config" not in kept and "other/build/outside" in kept  # the tool's own view
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        hostfs.copy_tree_out(fd, tmp_path / "out", excluded=tar_excluded(patterns=PATTERNS))
    finally:
        os.close(fd)
    assert _files(tmp_path / "out") == kept
    # Each pattern alone too: none leans on another.
    for pattern in PATTERNS:
        matcher = tar_excluded(patterns=[pattern])
        assert {
            f for f in FILES if not any(matcher("/".join(f.split("/")[: i + 1])) for i in range(f.count("/") + 1))
        } == (_gnu_tar_keeps(tree, [pattern])), pattern


@requires_sandbox
@requires_root
@pytest.mark.timeout(60)
def test_environment_download_with_exclusions_matches_harbors_tar_path(tmp_path: Path) -> None:
    """The host copy and Harbor's in-sandbox tar give the same tree for the same excludes."""
    env = _environment(make_task(tmp_path), tmp_path / "trial")

    async def main() -> None:
        await env.start(force_build=False)
        try:
            files = " ".join(f"/app/{rel}" for rel in FILES)
            await env.exec(f"for f in {files}; do mkdir -p $(dirname $f) && echo $f > $f; done")
            await env.download_dir_with_exclusions(source_dir="/app", target_dir=tmp_path / "host", exclude=PATTERNS)
            await BaseEnvironment.download_dir_with_exclusions(
                env, source_dir="/app", target_dir=tmp_path / "tar", exclude=PATTERNS
            )
        finally:
            await env.stop(delete=True)

    run(main())
    assert _files(tmp_path / "host") == _files(tmp_path / "tar")
    assert "src/m.py" in _files(tmp_path / "host") and "logs/run.log" not in _files(tmp_path / "host")
    for rel in _files(tmp_path / "tar"):
        assert (tmp_path / "host" / rel).read_bytes() == (tmp_path / "tar" / rel).read_bytes()


@requires_sandbox
@requires_root
@pytest.mark.timeout(60)
def test_environment_empties_dirs_on_the_host_as_harbors_command_does(tmp_path: Path) -> None:
    """Before verification /tests and /logs/verifier are emptied: on the host now, to the
    same result as Harbor's command (a symlink in the way replaced by a directory, the
    content gone, mode 777), and nothing the sandbox's symlinks point at on the host is
    touched."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("host")
    env = _environment(make_task(tmp_path), tmp_path / "trial")
    plant = (
        "mkdir -p /tests/sub/deep && echo x > /tests/sub/deep/f && echo y > /tests/.hidden && "
        f"ln -s {victim} /tests/link && ln -s {victim}/keep.txt /tests/filelink && "
        f"rm -rf /logs/verifier && ln -s {victim} /logs/verifier"
    )
    show = "ls -A /tests /logs/verifier; stat -c '%n %a %F' /tests /logs/verifier"

    async def main() -> tuple[str | None, str | None]:
        await env.start(force_build=False)
        try:
            await env.exec(plant, user="root")
            await env.empty_dirs(["/tests", "/logs/verifier"], chmod=True)
            host = (await env.exec(show)).stdout
            await env.exec(plant, user="root")
            await BaseEnvironment.empty_dirs(env, ["/tests", "/logs/verifier"], chmod=True)
            return host, (await env.exec(show)).stdout
        finally:
            await env.stop(delete=True)

    host, command = run(main())
    assert host == command
    assert host == "/logs/verifier:\n\n/tests:\n/tests 777 directory\n/logs/verifier 777 directory\n"
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"] and (victim / "keep.txt").read_text() == "host"
