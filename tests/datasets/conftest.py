"""Helpers for dataset tests: copies of the example tasks and small hand-made tasks."""

from __future__ import annotations

import io
import os
import random
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_TASKS = EXAMPLES / "tasks"
EXAMPLE_SLUGS = sorted(p.name for p in EXAMPLE_TASKS.iterdir() if (p / "task.toml").is_file())

TASK_TOML = """\
schema_version = "1.4"

[task]
name = "test/{slug}"

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 120.0

[environment]
cpus = 1
memory_mb = 1024
workdir = "/app"
"""


def scramble_mtimes(root: Path, seed: int) -> None:
    """Give every file and folder a different, arbitrary mtime (digests must not care)."""
    rng = random.Random(seed)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            t = rng.randint(10**8, 2 * 10**9)
            os.utime(Path(dirpath) / name, (t, t), follow_symlinks=False)


def write_task(root: Path, slug: str, *, toml: str | None = None, marker: str = "") -> Path:
    """A minimal valid Harbor task folder at root/slug."""
    task = root / slug
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text(toml if toml is not None else TASK_TOML.format(slug=slug))
    (task / "instruction.md").write_text(f"Write /app/{slug}.txt{marker}\n")
    (task / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    test = task / "tests" / "test.sh"
    test.write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    test.chmod(0o755)
    solve = task / "solution" / "solve.sh"
    solve.write_text(f"#!/bin/bash\ntouch /app/{slug}.txt\n")
    solve.chmod(0o755)
    return task


def tar_gz(root: Path, *, arcname: str = "") -> io.BytesIO:
    """A tar.gz of the folder root (its contents at the top level unless arcname is given)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        if arcname:
            tar.add(root, arcname=arcname)
        else:
            for child in sorted(root.iterdir()):
                tar.add(child, arcname=child.name)
    buf.seek(0)
    buf.name = "tasks.tar.gz"
    return buf


@pytest.fixture
def examples_copy(tmp_path: Path) -> Callable[[int], Path]:
    """copy(seed) -> a fresh copy of examples/tasks with scrambled mtimes."""

    def copy(seed: int) -> Path:
        dest = tmp_path / f"copy{seed}" / "tasks"
        shutil.copytree(EXAMPLE_TASKS, dest, symlinks=True)
        scramble_mtimes(dest, seed)
        return dest

    return copy


@pytest.fixture(autouse=True)
def _object_store(settings, tmp_path_factory) -> None:
    # Each test run gets its own filesystem store; nothing leaks into var/.
    settings.SYNTH_OBJECT_STORE = f"file://{tmp_path_factory.mktemp('objects')}"
