"""Who owns what a worker leaves on its host, and the clean-up of what dead owners left.

Every sandbox directory holds ``meta.json`` with its owner (pid and start time), its init's
pid, its cgroups and whether its storage is a mounted tmpfs: enough for another process to
clean it up once the owner is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from synth_sandbox.mounts import umount
from synth_sandbox.processes import is_zombie, process_start_time


def owner_record() -> dict[str, int | str | None]:
    """This process as the owner of what it leaves on the host (a sandbox, a work dir):
    its pid and start time, which a reused pid does not share."""
    pid = os.getpid()
    return {"owner_pid": pid, "owner_start": process_start_time(pid)}


def owner_alive(record: Mapping[str, object]) -> bool:
    """Whether the process ``owner_record`` described still runs (a zombie does not: it is
    a killed worker child its parent has not reaped yet)."""
    try:
        pid = int(record.get("owner_pid") or 0)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return False
    return pid > 0 and process_start_time(pid) == record.get("owner_start") and not is_zombie(pid)


def reap_stale_sandboxes(base_dir: Path) -> list[str]:
    """Clean up sandboxes left behind by a worker that died (kill, unmount, rmdir, delete).

    A sandbox is stale when the process recorded as its owner in meta.json no longer exists
    (or is another process with a reused pid).  Returns the names removed.  Call it when a
    worker or one of its pool processes starts, with the base_dir it uses: the sandboxes of
    live processes (siblings in the same pool) are left alone.
    """
    removed: list[str] = []
    if not base_dir.is_dir():
        return removed
    for meta_path in sorted(base_dir.glob("*/meta.json")):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        if meta.get("kept") or owner_alive(meta):
            continue  # kept on purpose (stop(delete=False)), or its worker is alive
        sandbox_dir = meta_path.parent
        cgroups = [Path(p) for p in meta.get("cgroups", [])]
        for _attempt in range(50):
            pids: set[int] = set()
            for cg in cgroups:
                for dirpath, _d, _f in os.walk(cg):
                    with contextlib.suppress(OSError, ValueError):
                        pids |= {int(x) for x in (Path(dirpath) / "cgroup.procs").read_text().split()}
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        init_pid = meta.get("init_pid")
        if init_pid and not cgroups:
            with contextlib.suppress(OSError):
                os.kill(int(init_pid), signal.SIGKILL)
        if meta.get("tmpfs"):
            with contextlib.suppress(OSError):
                umount(sandbox_dir / "fs")
        for cg in cgroups:
            for dirpath, _d, _f in os.walk(cg, topdown=False):
                with contextlib.suppress(OSError):
                    Path(dirpath).rmdir()
        shutil.rmtree(sandbox_dir, ignore_errors=True)
        removed.append(sandbox_dir.name)
    return removed


def sandbox_meta_write(
    *,
    sandbox_dir: Path,
    kept: bool,
    init_pid: int | None,
    cgroup_dirs: Sequence[Path],
    tmpfs: bool,
    model_base_url: str | None,
    enforced_limits: Mapping[str, int | float],
    unenforced_limits: Mapping[str, str],
) -> None:
    """Write the sandbox's meta.json (atomically): its owner and what reap_stale_sandboxes must
    kill, unmount and remove once that owner is gone; a kept sandbox holds none of these."""
    meta = {
        "kept": kept,
        **owner_record(),
        "init_pid": init_pid,
        "cgroups": [str(d) for d in cgroup_dirs] if not kept else [],
        "tmpfs": tmpfs and not kept,
        "model_base_url": model_base_url,
        "enforced_limits": dict(enforced_limits),
        "unenforced_limits": dict(unenforced_limits),
    }
    tmp = sandbox_dir / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2))
    os.chmod(tmp, 0o600)
    tmp.replace(sandbox_dir / "meta.json")
