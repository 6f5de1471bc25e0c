from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from synth_cli.packing import pack_folder
from tests.cli.conftest import make_task, one_line

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


@pytest.fixture
def tasks_dir(tmp_path) -> Path:
    """The project's example tasks, or two tiny ones if they are not there."""
    if EXAMPLES.is_dir() and any((p / "task.toml").is_file() for p in EXAMPLES.iterdir()):
        return EXAMPLES
    root = tmp_path / "tasks"
    make_task(root, "hello")
    make_task(root, "world", instruction="Write world.txt.")
    return root


def test_push_then_show(synth, tasks_dir):
    expected = sorted(p.name for p in tasks_dir.iterdir() if (p / "task.toml").is_file())
    pushed = synth.json("dataset", "push", str(tasks_dir), "--name", "team/examples", "--version", "v1")
    assert pushed["reference"] == "team/examples@v1"
    assert pushed["task_count"] == len(expected)

    again = synth("dataset", "push", str(tasks_dir), "--name", "team/examples", "--version", "v1")
    assert again.exit_code == 0, again.stderr
    assert "already imported" in again.stderr

    shown = synth.json("dataset", "show", "team/examples@v1")
    assert shown["digest"] == pushed["digest"]
    assert [t["name"].rsplit("/", 1)[-1] for t in shown["tasks"]] == expected
    assert shown["next"] is None
    human = synth("dataset", "show", "team/examples@v1")
    assert human.exit_code == 0 and "team/examples@v1" in human.stdout


def test_push_a_single_task_folder_and_a_registry(synth, tmp_path):
    task = make_task(tmp_path / "one", "hello")
    single = synth.json("dataset", "push", str(task), "--name", "hello", "--version", "1.0")
    assert single["reference"] == "team/hello@1.0" and single["task_count"] == 1

    root = tmp_path / "bench"
    make_task(root / "tasks", "alpha")
    make_task(root / "tasks", "beta", instruction="Other.")
    make_task(root / "unused", "gamma")
    registry = [
        {
            "name": "bench",
            "version": "1",
            "description": "two tasks",
            "tasks": [{"name": "beta", "path": "tasks/beta"}, {"name": "alpha", "path": "tasks/alpha"}],
        }
    ]
    (root / "registry.json").write_text(json.dumps(registry))
    pushed = synth.json("dataset", "push", str(root / "registry.json"), "--name", "team/bench", "--version", "1")
    assert pushed["task_count"] == 2


def test_unknown_and_malformed_references(synth):
    result = synth("dataset", "show", "team/nope@v1")
    assert result.exit_code == 1
    assert one_line(result.stderr) == "synth: dataset team/nope@v1 not found (404)"
    for bad in ("team/nope", "nope@v1", "a/b/c@v1"):
        result = synth("dataset", "show", bad)
        assert result.exit_code == 2, bad
        assert one_line(result.stderr).startswith(f"synth: malformed dataset reference '{bad}'")


def test_push_of_a_broken_task_fails_with_the_server_message(synth, tmp_path):
    task = make_task(tmp_path / "tasks", "broken")
    (task / "task.toml").write_text("this is [not toml\n")
    result = synth("dataset", "push", str(tmp_path / "tasks"), "--name", "team/broken", "--version", "v1")
    assert result.exit_code == 1
    assert "broken" in one_line(result.stderr)
    empty = tmp_path / "empty"
    empty.mkdir()
    result = synth("dataset", "push", str(empty), "--name", "team/empty", "--version", "v1")
    assert result.exit_code == 2 and "no task folders" in one_line(result.stderr)


@pytest.mark.django_db(transaction=False)
def test_packing_is_deterministic_and_skips_caches(tmp_path):
    root = tmp_path / "tasks"
    task = make_task(root, "hello")
    first = pack_folder(root).archive
    (task / "__pycache__").mkdir()
    (task / "__pycache__" / "x.pyc").write_bytes(b"junk")
    (task / "tests" / "test.sh").touch()  # a new mtime changes nothing
    second = pack_folder(root).archive
    assert first == second
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(first))) as tar:
        names = tar.getnames()
        assert names == sorted(names)
        assert {m.mtime for m in tar.getmembers()} == {0}
        assert tar.getmember("hello/tests/test.sh").mode == 0o755


def test_push_warns_about_tasks_the_local_sandbox_cannot_run(synth, tmp_path):
    root = tmp_path / "tasks"
    make_task(root, "fine")
    odd = make_task(root, "odd")
    (odd / "environment" / "Dockerfile").write_text('FROM ubuntu:24.04\nWORKDIR /app\nSHELL ["/bin/bash", "-c"]\n')

    result = synth("dataset", "push", str(root), "--name", "team/mixed", "--version", "1")
    assert result.exit_code == 0, result.stderr  # imported: other environments may run it
    assert "imported: team/mixed@1" in result.stderr
    warning = result.stderr[result.stderr.index("warning: ") :]
    assert warning.startswith("warning: the local sandbox cannot run 1 task(s) of team/mixed@1")
    assert (
        '  odd: environment/Dockerfile line 3 (SHELL ["/bin/bash", "-c"]): not applied by the local sandbox' in warning
    )
    assert "fine:" not in warning

    # With --json the object says it too, and the warning still goes to stderr.
    again = synth("dataset", "push", str(root), "--name", "team/mixed", "--version", "1", "--json")
    assert again.exit_code == 0 and "warning: the local sandbox cannot run 1 task(s)" in again.stderr
    body = json.loads(again.stdout)
    assert body["local_sandbox"]["unsupported_count"] == 1
    assert body["local_sandbox"]["unsupported"][0]["name"] == "odd"
