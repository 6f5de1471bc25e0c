"""What a dead trial process left on its host is removed; what a live one holds never is."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from apps.trials.workdirs import OWNER_FILE, work_dir_make, work_dirs_reap
from synth_sandbox.sandbox import owner_alive, owner_record

ROOT = Path(__file__).resolve().parents[2]


def _other_process(owner_file: Path) -> subprocess.Popen:
    """A process that records itself as a work dir's owner, then idles until killed."""
    code = (
        "import json, sys, time; from synth_sandbox.sandbox import owner_record; "
        "open(sys.argv[1], 'w').write(json.dumps(owner_record())); time.sleep(300)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(owner_file)], cwd=ROOT)
    deadline = time.monotonic() + 30
    while not owner_file.exists() or not owner_file.read_text():
        assert time.monotonic() < deadline, "the owner did not record itself"
        time.sleep(0.05)
    return proc


def test_only_the_work_dirs_of_dead_owners_are_removed(tmp_path) -> None:
    root = tmp_path / "work"
    mine = work_dir_make(root=root, name="trl_mine.1")
    assert json.loads((mine / OWNER_FILE).read_text()) == owner_record()
    theirs = root / "trl_sibling.1"
    theirs.mkdir()
    sibling = _other_process(theirs / OWNER_FILE)
    (theirs / "task").mkdir()
    making = root / "trl_new.1"
    making.mkdir()  # no owner record yet: in the making
    try:
        assert work_dirs_reap(root=root) == []  # every owner is alive
        sibling.kill()  # SIGKILL; not waited for yet: a zombie, as a killed pool child is for a moment
        record = json.loads((theirs / OWNER_FILE).read_text())
        deadline = time.monotonic() + 30
        while owner_alive(record):  # until the kill has landed; the zombie counts as dead
            assert time.monotonic() < deadline, "the killed owner still looks alive"
            time.sleep(0.05)
        assert Path(f"/proc/{sibling.pid}").exists()  # not reaped by its parent (this test) yet
        assert work_dirs_reap(root=root) == ["trl_sibling.1"]
    finally:
        sibling.kill()
        sibling.wait()
    assert mine.is_dir() and making.is_dir() and not theirs.exists()


def test_a_reused_pid_is_not_its_owner() -> None:
    record = owner_record()
    assert owner_alive(record)
    assert not owner_alive({**record, "owner_start": "1"})  # the same pid, another process
    assert not owner_alive({})
    assert not owner_alive({"owner_pid": "junk"})
