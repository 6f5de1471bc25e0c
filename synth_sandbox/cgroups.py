"""Per-sandbox cgroups: discovery of what the host offers, limits, whole-tree kill.

Hosts come in three shapes and all of them occur in practice:

* cgroup v1 only (old distributions): one hierarchy per controller, e.g. ``/sys/fs/cgroup/memory``;
* hybrid (v1 controllers plus an empty cgroup2 mount, e.g. ``/sys/fs/cgroup/unified``);
* cgroup v2 only (current distributions): ``/sys/fs/cgroup`` with ``cgroup.controllers``.

A sandbox gets one *logical* cgroup that is a directory in every hierarchy we use.  Each
controller (memory, pids, cpu) is taken from v1 when it is mounted there (it cannot be in v2
at the same time) and otherwise from v2 if v2 offers it.  Process *tracking* (which processes
belong to the sandbox or to one exec, and killing them all) prefers v2 because ``cgroup.kill``
kills a whole subtree atomically even when no controller is enabled; without v2 it falls back
to the v1 freezer (freeze, SIGKILL everything, thaw: nothing can fork in between) and then to
a plain kill loop over the pids hierarchy.

Everything that cannot be set up is *reported*, never assumed: ``apply_limits`` returns the
limits actually written and, for the others, the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# Controllers the sandbox uses.  freezer only exists in v1 (v2 has cgroup.freeze built in).
LIMIT_CONTROLLERS = ("memory", "pids", "cpu")
V1_CONTROLLERS = frozenset(
    {
        "blkio",
        "cpu",
        "cpuacct",
        "cpuset",
        "devices",
        "freezer",
        "hugetlb",
        "memory",
        "misc",
        "net_cls",
        "net_prio",
        "perf_event",
        "pids",
        "rdma",
    }
)
CPU_PERIOD_US = 100_000
DEFAULT_PARENT_NAME = "synth-sandbox"


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy and the directory under which sandboxes are created."""

    version: int  # 1 or 2
    mountpoint: Path
    controllers: frozenset[str]
    parent: Path  # absolute directory for sandbox cgroups (created on demand)

    @property
    def label(self) -> str:
        if self.version == 2:
            return "cgroup2"
        return "cgroup1:" + ",".join(sorted(self.controllers & V1_CONTROLLERS))


@dataclass(frozen=True)
class CgroupPlan:
    """Which hierarchy provides which function, decided once per process."""

    by_controller: dict[str, Hierarchy]
    tracking: Hierarchy | None  # where process membership is read and killed
    freezer: Hierarchy | None  # v1 freezer (only used when tracking is not v2)
    problems: dict[str, str]  # controller -> why it is unavailable

    @property
    def hierarchies(self) -> list[Hierarchy]:
        seen: dict[Path, Hierarchy] = {}
        for h in [*self.by_controller.values(), self.tracking, self.freezer]:
            if h is not None:
                seen.setdefault(h.mountpoint, h)
        return list(seen.values())


def _parse_mountinfo(text: str) -> list[tuple[str, Path, str, set[str]]]:
    """(mount root, mount point, fs type, super options) of every cgroup mount."""
    mounts: list[tuple[str, Path, str, set[str]]] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        rfields = right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        fstype = rfields[0]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        # mountinfo escapes spaces etc. as octal (\040); cgroup mount points rarely have them.
        mountpoint = Path(fields[4].encode().decode("unicode_escape"))
        mounts.append((fields[3], mountpoint, fstype, set(rfields[2].split(","))))
    return mounts


def _parse_proc_cgroup(text: str) -> dict[frozenset[str], str]:
    """Map controller set (empty set = v2) to this process's cgroup path."""
    result: dict[frozenset[str], str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, names, path = parts
        result[frozenset(n for n in names.split(",") if n)] = path
    return result


def _own_dir(mountpoint: Path, mount_root: str, own_path: str) -> Path:
    # In a container the hierarchy may be mounted from a sub-directory ("mount root"); the
    # process's path in /proc/self/cgroup is then relative to the real root.
    if mount_root != "/" and (own_path == mount_root or own_path.startswith(mount_root.rstrip("/") + "/")):
        own_path = own_path[len(mount_root.rstrip("/")) :] or "/"
    elif mount_root != "/":
        own_path = "/"
    return mountpoint / own_path.lstrip("/")


def detect_hierarchies(
    cgroup_parent: str | None = None,
    *,
    mountinfo: str | None = None,
    proc_cgroup: str | None = None,
) -> list[Hierarchy]:
    """Every usable cgroup hierarchy of this host, with the sandbox parent directory in each.

    ``cgroup_parent`` (a path relative to each hierarchy's root, e.g. ``/synth``) places the
    sandboxes there; by default they go under ``<this process's cgroup>/synth-sandbox`` so that
    they are accounted inside whatever limits the worker itself runs under (the systemd
    "delegation" model) and never outside them.
    """
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    if proc_cgroup is None:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    own = _parse_proc_cgroup(proc_cgroup)
    found: list[Hierarchy] = []
    seen: set[frozenset[str]] = set()
    for mount_root, mountpoint, fstype, options in _parse_mountinfo(mountinfo):
        if fstype == "cgroup2":
            key: frozenset[str] = frozenset()
            controllers_file = mountpoint / "cgroup.controllers"
            version = 2
        else:
            key = frozenset(options & V1_CONTROLLERS)
            if not key:
                continue  # named hierarchy such as name=systemd: no controllers
            controllers_file = None
            version = 1
        if key in seen:
            continue  # the same hierarchy mounted twice
        own_path = next((p for names, p in own.items() if names == key), None)
        if own_path is None:
            own_path = next((p for names, p in own.items() if key and key <= names), "/")
        if cgroup_parent:
            parent = mountpoint / cgroup_parent.strip("/")
        else:
            parent = _own_dir(mountpoint, mount_root, own_path) / DEFAULT_PARENT_NAME
        if version == 2:
            assert controllers_file is not None
            try:
                # What can be enabled for children is what the parent's parent offers.
                base = parent.parent if parent.parent.exists() else mountpoint
                controllers = frozenset((base / "cgroup.controllers").read_text().split())
            except OSError:
                controllers = frozenset()
        else:
            controllers = key
        if not os.access(mountpoint, os.W_OK):
            continue  # read-only cgroupfs (unprivileged container): nothing usable
        seen.add(key)
        found.append(Hierarchy(version=version, mountpoint=mountpoint, controllers=controllers, parent=parent))
    return found


def make_plan(hierarchies: list[Hierarchy]) -> CgroupPlan:
    v1 = {c: h for h in hierarchies if h.version == 1 for c in h.controllers}
    v2 = next((h for h in hierarchies if h.version == 2), None)
    by_controller: dict[str, Hierarchy] = {}
    problems: dict[str, str] = {}
    for controller in LIMIT_CONTROLLERS:
        if controller in v1:
            by_controller[controller] = v1[controller]
        elif v2 is not None and controller in v2.controllers:
            by_controller[controller] = v2
        else:
            problems[controller] = f"no writable cgroup hierarchy offers the {controller} controller"
    tracking = v2 or v1.get("pids") or v1.get("freezer") or v1.get("memory") or v1.get("cpu")
    freezer = v1.get("freezer") if (tracking is None or tracking.version == 1) else None
    if tracking is None:
        problems["tracking"] = "no writable cgroup hierarchy: timeouts kill the process group only"
    return CgroupPlan(by_controller=by_controller, tracking=tracking, freezer=freezer, problems=problems)


@functools.cache
def open_time_migration_checks() -> bool:
    """Whether this kernel checks a write to cgroup.procs against the opener's credentials
    and cgroup namespace (Linux 5.16, the fix for CVE-2021-4197), not the writer's."""
    match = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return match is not None and (int(match[1]), int(match[2])) >= (5, 16)


def _write(path: Path, value: str) -> None:
    # cgroupfs files must be written in one write(2); Path.write_text does that for short values.
    with open(path, "w") as f:
        f.write(value)


def _read_pids(path: Path) -> set[int]:
    try:
        return {int(x) for x in path.read_text().split()}
    except (FileNotFoundError, ProcessLookupError):
        return set()
    except OSError as exc:
        if exc.errno in (errno.ENODEV, errno.ENOENT):
            return set()
        raise


@dataclass
class LimitResult:
    enforced: dict[str, int | float]
    unenforced: dict[str, str]


class SandboxCgroup:
    """A logical cgroup (one directory per hierarchy in the plan)."""

    def __init__(self, plan: CgroupPlan, dirs: dict[Path, Path], owned: set[Path] | None = None) -> None:
        self.plan = plan
        self.dirs = dirs  # hierarchy mountpoint -> directory of this cgroup
        self.owned = set(dirs.values()) if owned is None else owned  # directories remove() deletes

    @classmethod
    def create(cls, plan: CgroupPlan, name: str) -> SandboxCgroup:
        dirs: dict[Path, Path] = {}
        created: list[Path] = []
        try:
            for h in plan.hierarchies:
                h.parent.mkdir(parents=True, exist_ok=True)
                if h.version == 2:
                    _enable_v2_controllers(h, plan)
                d = h.parent / name
                for attempt in range(3):
                    try:
                        d.mkdir()
                        break
                    except FileNotFoundError:
                        # Another sandbox's stop() removed the shared parent in between.
                        if attempt == 2:
                            raise
                        h.parent.mkdir(parents=True, exist_ok=True)
                created.append(d)
                dirs[h.mountpoint] = d
        except BaseException:
            for d in reversed(created):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
        return cls(plan, dirs)

    def child(self, name: str) -> SandboxCgroup:
        """A child used to track (and kill) one exec's processes.

        It is created only in the tracking hierarchy (and the v1 freezer): in the memory, pids
        and cpu hierarchies the exec joins the sandbox cgroup itself, so that thousands of execs
        do not create thousands of memory cgroups (removed v1 memcgs linger in the kernel).
        """
        tracking_mounts = {h.mountpoint for h in (self.plan.tracking, self.plan.freezer) if h is not None}
        dirs: dict[Path, Path] = {}
        owned: set[Path] = set()
        for mountpoint, d in self.dirs.items():
            if mountpoint in tracking_mounts:
                (d / name).mkdir(exist_ok=True)
                dirs[mountpoint] = d / name
                owned.add(d / name)
            else:
                dirs[mountpoint] = d
        return SandboxCgroup(self.plan, dirs, owned)

    def children(self) -> list[SandboxCgroup]:
        """The child cgroups that exist now (made by :meth:`child`), by name."""
        d = self._dir_for(self.plan.tracking)
        if d is None or not d.is_dir():
            return []
        return [self.child(sub.name) for sub in sorted(d.iterdir()) if sub.is_dir()]

    def _dir_for(self, h: Hierarchy | None) -> Path | None:
        return None if h is None else self.dirs.get(h.mountpoint)

    @property
    def procs_files(self) -> list[Path]:
        """The cgroup.procs file of every hierarchy: a process joins by writing its pid to each."""
        return [d / "cgroup.procs" for d in self.dirs.values()]

    @property
    def cpu_procs_file(self) -> Path | None:
        """The cpu hierarchy's cgroup.procs when an exec can join it last, from inside the
        sandbox through a descriptor the host opened (see synth_sandbox.execs), so that the
        platform's own helpers before the command do not spend the task's CPU quota.

        Only where the cpu controller has a hierarchy of its own (cgroup v1): the tracking
        hierarchy must hold every process of the exec from its first helper on, or a timeout
        could miss one. And only on Linux 5.16 or later, which checks a migration against the
        credentials the file was opened with, not the (unprivileged, capability-less) writer's.
        """
        cpu = self.plan.by_controller.get("cpu")
        if cpu is None or cpu.version != 1 or not open_time_migration_checks():
            return None
        if any(h is not None and h.mountpoint == cpu.mountpoint for h in (self.plan.tracking, self.plan.freezer)):
            return None
        d = self.dirs.get(cpu.mountpoint)
        return None if d is None else d / "cgroup.procs"

    def apply_limits(
        self,
        *,
        memory_bytes: int | None,
        pids_max: int | None,
        cpus: float | None,
    ) -> LimitResult:
        enforced: dict[str, int | float] = {}
        unenforced: dict[str, str] = {}
        wanted = {"memory": memory_bytes, "pids": pids_max, "cpu": cpus}
        for controller, value in wanted.items():
            if value is None:
                continue
            h = self.plan.by_controller.get(controller)
            d = self._dir_for(h)
            if h is None or d is None:
                unenforced[controller] = self.plan.problems.get(controller, f"{controller} controller unavailable")
                continue
            try:
                if controller == "memory":
                    self._set_memory(h, d, int(value))
                    enforced["memory_bytes"] = int(value)
                elif controller == "pids":
                    _write(d / "pids.max", str(int(value)))
                    enforced["pids_max"] = int(value)
                else:
                    quota = max(1000, int(float(value) * CPU_PERIOD_US))
                    if h.version == 1:
                        _write(d / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                        _write(d / "cpu.cfs_quota_us", str(quota))
                    else:
                        _write(d / "cpu.max", f"{quota} {CPU_PERIOD_US}")
                    enforced["cpus"] = float(value)
            except OSError as exc:
                unenforced[controller] = f"writing the {controller} limit under {d} failed: {exc}"
        return LimitResult(enforced=enforced, unenforced=unenforced)

    @staticmethod
    def _set_memory(h: Hierarchy, d: Path, limit: int) -> None:
        if h.version == 1:
            _write(d / "memory.limit_in_bytes", str(limit))
            # With swap accounting, also cap memory+swap so the limit cannot be dodged by
            # swapping (the file exists only when swap accounting is on).
            memsw = d / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                with contextlib.suppress(OSError):
                    _write(memsw, str(limit))
        else:
            _write(d / "memory.max", str(limit))
            swap = d / "memory.swap.max"
            if swap.exists():
                with contextlib.suppress(OSError):
                    _write(swap, "0")

    def oom_kills(self) -> int | None:
        """How many processes the kernel OOM-killed in this cgroup (None: not measurable)."""
        h = self.plan.by_controller.get("memory")
        d = self._dir_for(h)
        if h is None or d is None:
            return None
        try:
            text = (d / ("memory.oom_control" if h.version == 1 else "memory.events")).read_text()
        except OSError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return None

    def _walk(self, root: Path) -> Iterator[Path]:
        """root and its descendant cgroup directories, deepest first."""
        for dirpath, _dirnames, _files in os.walk(root, topdown=False):
            yield Path(dirpath)

    def pids(self) -> set[int]:
        """Every process in this cgroup and its descendants (host pid namespace)."""
        d = self._dir_for(self.plan.tracking)
        if d is None:
            return set()
        result: set[int] = set()
        for sub in self._walk(d):
            result |= _read_pids(sub / "cgroup.procs")
        return result

    def kill_now(self) -> None:
        """SIGKILL every process of the subtree without waiting (safe to call while cancelled)."""
        tracking = self.plan.tracking
        d = self._dir_for(tracking)
        if tracking is not None and d is not None and tracking.version == 2 and (d / "cgroup.kill").exists():
            try:
                _write(d / "cgroup.kill", "1")
                return
            except OSError as exc:
                logger.warning("cgroup.kill on %s failed (%s); falling back to signals", d, exc)
        freezer_dir = self._dir_for(self.plan.freezer)
        frozen = False
        if freezer_dir is not None:
            # Freezing first means a fork bomb cannot outrun the kill loop.
            try:
                _write(freezer_dir / "freezer.state", "FROZEN")
                frozen = True
                deadline = time.monotonic() + 2.0
                while time.monotonic() < deadline:
                    if (freezer_dir / "freezer.state").read_text().strip() == "FROZEN":
                        break
                    time.sleep(0.002)
            except OSError as exc:
                logger.warning("freezing %s failed: %s", freezer_dir, exc)
        try:
            for pid in self.pids() | self._freezer_pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            if frozen and freezer_dir is not None:
                with contextlib.suppress(OSError):
                    _write(freezer_dir / "freezer.state", "THAWED")

    def _freezer_pids(self) -> set[int]:
        d = self._dir_for(self.plan.freezer)
        if d is None:
            return set()
        result: set[int] = set()
        for sub in self._walk(d):
            result |= _read_pids(sub / "cgroup.procs")
        return result

    async def kill(self, timeout: float = 10.0) -> bool:
        """Kill the whole subtree and wait until it is empty. Returns False if processes remain."""
        deadline = time.monotonic() + timeout
        delay = 0.002
        while True:
            self.kill_now()
            if not (self.pids() | self._freezer_pids()):
                return True
            if time.monotonic() >= deadline:
                logger.warning("processes survive in %s after SIGKILL: %s", self.dirs, sorted(self.pids()))
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    def is_empty(self) -> bool:
        return not self.pids()

    def remove(self) -> list[str]:
        """rmdir the subtree in every hierarchy (processes must be gone). Returns failures."""
        failures: list[str] = []
        for d in self.dirs.values():
            if d not in self.owned or not d.exists():
                continue
            for sub in self._walk(d):
                try:
                    sub.rmdir()
                except OSError as exc:
                    failures.append(f"{sub}: {exc}")
        return failures

    def remove_parents_if_empty(self) -> None:
        # The shared "synth-sandbox" parent is removed when the last sandbox goes away, so a
        # worker leaves nothing behind; EBUSY simply means another sandbox still uses it.
        for h in self.plan.hierarchies:
            if h.parent.name == DEFAULT_PARENT_NAME:
                with contextlib.suppress(OSError):
                    h.parent.rmdir()


def _enable_v2_controllers(h: Hierarchy, plan: CgroupPlan) -> None:
    """Enable the controllers taken from v2 in the parent's subtree_control (best effort).

    cgroup v2's "no internal processes" rule forbids this in a non-root cgroup that itself
    contains processes, which is the usual situation for a worker that was not started in a
    delegated cgroup; the failure is logged and the limit then shows up as not enforced.
    """
    wanted = sorted(c for c, hh in plan.by_controller.items() if hh is h)
    if not wanted:
        return
    for level in (h.parent.parent, h.parent):
        control = level / "cgroup.subtree_control"
        try:
            current = set(control.read_text().split())
        except OSError:
            continue
        missing = [c for c in wanted if c not in current]
        if not missing:
            continue
        try:
            _write(control, " ".join(f"+{c}" for c in missing))
        except OSError as exc:
            logger.warning("cannot enable %s in %s: %s", missing, control, exc)
            for c in missing:
                plan.problems[c] = (
                    f"cgroup v2: enabling {c} in {control} failed ({exc}); run the worker in a delegated cgroup or pass cgroup_parent"
                )
                plan.by_controller.pop(c, None)
