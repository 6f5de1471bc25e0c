"""A sandbox's resource limits, and which of them this host enforces.

memory / pids / cpu come from cgroups (see cgroups.py), storage from the size of the tmpfs
that holds the writable directories, core dumps are off and an optional CPU-time rlimit is set
for every exec (by its shell's ``ulimit``, see execs.py).  Each exec also runs in its own child cgroup of the tracking
hierarchy, so a timeout or a cancellation kills exactly the processes that exec started
(including daemonised ones), and ``Sandbox.stop()`` kills the init, whose death takes down
its PID namespace, and then whatever is left in the cgroup tree.

What cannot be enforced is recorded with its reason (``unenforced``), never silently dropped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from synth_sandbox.cgroups import SandboxCgroup, detect_hierarchies, make_plan
from synth_sandbox.mounts import mount_tmpfs

DEFAULT_PIDS_MAX = 2048


@dataclass(frozen=True)
class SandboxLimits:
    memory_mb: int | None = None
    cpus: float | None = None
    storage_mb: int | None = None
    pids_max: int | None = DEFAULT_PIDS_MAX
    cpu_time_sec: int | None = None  # RLIMIT_CPU per process (optional)


def storage_limit_apply(
    *,
    fs: Path,
    storage_mb: int | None,
    storage_backend: Literal["tmpfs", "disk"],
    is_root: bool,
    uid: int,
    gid: int,
    enforced: dict[str, int | float],
    unenforced: dict[str, str],
) -> bool:
    """Mount a tmpfs of storage_mb on the (empty) fs directory when possible, recording the
    outcome in enforced / unenforced.  Returns whether a tmpfs was mounted."""
    if storage_mb is None:
        return False
    if storage_backend != "tmpfs":
        unenforced["storage_mb"] = "storage_backend='disk': writable directories are not size-limited"
    elif not is_root:
        unenforced["storage_mb"] = "mounting a size-limited tmpfs needs root"
    else:
        try:
            mount_tmpfs(fs, storage_mb, uid, gid)
        except OSError as exc:
            unenforced["storage_mb"] = str(exc)
        else:
            enforced["storage_mb"] = storage_mb
            return True
    return False


def cgroup_limits_apply(
    *,
    name: str,
    limits: SandboxLimits,
    cgroup_parent: str | None,
    log: logging.Logger,
    enforced: dict[str, int | float],
    unenforced: dict[str, str],
) -> SandboxCgroup | None:
    """Create the sandbox's cgroup with the memory / pids / cpu limits, recording what is
    enforced and what is not (and why).  None: no cgroups on this host."""
    wanted = {
        "memory_mb": limits.memory_mb,
        "pids_max": limits.pids_max,
        "cpus": limits.cpus,
    }
    try:
        plan = make_plan(detect_hierarchies(cgroup_parent))
        if not plan.hierarchies:
            raise OSError("no writable cgroup hierarchy on this host")
        cgroup = SandboxCgroup.create(plan, name)
    except OSError as exc:
        log.warning("sandbox %s: no cgroups (%s); limits are not enforced", name, exc)
        for key, value in wanted.items():
            if value is not None:
                unenforced[key] = f"no cgroups: {exc}"
        unenforced["process_tracking"] = "no cgroups: a timeout kills the exec's process group only"
        return None
    result = cgroup.apply_limits(
        memory_bytes=limits.memory_mb * 1024 * 1024 if limits.memory_mb is not None else None,
        pids_max=limits.pids_max,
        cpus=limits.cpus,
    )
    if "memory_bytes" in result.enforced:
        enforced["memory_mb"] = int(result.enforced["memory_bytes"]) // (1024 * 1024)
    if "pids_max" in result.enforced:
        enforced["pids_max"] = result.enforced["pids_max"]
    if "cpus" in result.enforced:
        enforced["cpus"] = result.enforced["cpus"]
    names = {"memory": "memory_mb", "pids": "pids_max", "cpu": "cpus"}
    for controller, reason in result.unenforced.items():
        unenforced[names.get(controller, controller)] = reason
    if plan.tracking is None:
        unenforced["process_tracking"] = plan.problems.get("tracking", "unavailable")
    if limits.cpu_time_sec is not None:
        enforced["cpu_time_sec"] = limits.cpu_time_sec
    return cgroup
