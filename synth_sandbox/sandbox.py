"""A local sandbox: bubblewrap namespaces + cgroups, one long-lived init, docker-exec-like execs.

Layout and life cycle
---------------------
``start()`` creates ``<base_dir>/<name>/`` on the host::

    <name>/            0711 root      (meta.json: owner pid, cgroups, mounts; for reap_stale_sandboxes)
      init.log                        bubblewrap's own stderr
      sock/model.sock                 per-sandbox Unix socket served by the model bridge
      fs/              tmpfs of storage_mb (or a plain directory), owned by the sandbox uid
        app/ logs/{agent,verifier,artifacts}/ tests/ solution/ tmp/ var/tmp/ root/ installed-agent/ runtime/

and then starts one *init* with bubblewrap: ``bwrap --unshare-all --unshare-user --uid 0 ...
-- sh -c 'sleep infinity'``.  Inside, the root is an empty tmpfs made read-only after setup, with
an allow-list of the host's system directories (``/usr``, ``/etc``, ``/opt``, ...) bound
read-only, a fresh ``/proc`` (own PID namespace), a minimal ``/dev``, a small ``/run``, and each
writable directory bound at its Harbor path (``/app``, ``/logs``, ``/tests``, ``/solution``,
``/tmp``, ...).  The host's ``/root``, ``/home``, ``/work``, ``/var``, ``/run`` (database
sockets!), ``/tmp`` and ``/sys`` are simply absent.

Every ``exec`` enters that init's namespaces with ``nsenter --all`` (like ``docker exec`` into
a running container): execs share the file system, the process table and the loopback
network with each other and with background processes they leave behind.  The alternative,
one ``bwrap`` per exec, would give every command a fresh PID and network namespace, so a
server or ``tmux`` started by one exec could not be reached by the next one.

Privileges
----------
As host root the init is started as an unprivileged host uid (``sandbox_uid``, default
2000000000) that is mapped to uid 0 *inside* a user namespace: tasks see themselves as root,
but to the host kernel they are that uid, with no capabilities outside the namespace, so the
host's root-only files (``/etc/shadow``, ``/root``) are unreadable and nothing of the host is
writable even through a remount.  Execs enter the user namespace too, and then drop every
capability (``setpriv --bounding-set=-all --no-new-privs``) so they have exactly the
privileges of bubblewrap's own child.  ``--disable-userns`` forbids nested user namespaces.

Environment
-----------
No variable of the worker reaches the sandbox.  Host-side helper processes run with a fixed
``PATH`` only (so ``LD_PRELOAD`` & co. in a task's env can never affect a process running as
host root), and the sandbox environment is handed to the innermost shell through a memfd,
which also keeps secrets such as API keys out of every process's command line.

Limits
------
memory / pids / cpu from cgroups (see cgroups.py), storage from the tmpfs size, core dumps off
and an optional CPU-time rlimit via ``prlimit``.  Each exec runs in its own child cgroup of the
tracking hierarchy, so a timeout or a cancellation kills exactly the processes that exec
started (including daemonised ones), and ``stop()`` kills the init, whose death takes down its
PID namespace, and then whatever is left in the cgroup tree.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import ctypes
import itertools
import json
import logging
import os
import posixpath
import re
import shutil
import signal
import stat
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from synth_sandbox import hostfs
from synth_sandbox.bridge import DEFAULT_MAX_CONNECTIONS, ModelBridge
from synth_sandbox.cgroups import SandboxCgroup, detect_hierarchies, make_plan
from synth_sandbox.dns import RESOLV_CONF, DnsRecorder

logger = logging.getLogger(__name__)

DEFAULT_SANDBOX_UID = 2_000_000_000
DEFAULT_MODEL_PORT = 18080
DEFAULT_PIDS_MAX = 2048
DEFAULT_MAX_OUTPUT_BYTES = 32 << 20
MODEL_SOCKET_IN_SANDBOX = "/run/synth/model.sock"
# Phase hooks (read-only inside) and what they observe (written by the sandbox, read by the host).
HOOKS_IN_SANDBOX = "/run/synth/hooks"
OBSERVED_IN_SANDBOX = "/run/synth/observed"
# For BASH_ENV: sourced by every non-interactive bash of a phase that asks for it. A command that
# does not exist is recorded before bash reports it as usual (exit 127), so that "the verifier
# needs a tool this host lacks" is a fact, not a guess from its output.
CHECK_HOOK = "check.sh"
_CHECK_HOOK_SCRIPT = f"""command_not_found_handle() {{
  printf '%s\\n' "$1" >> {OBSERVED_IN_SANDBOX}/missing-commands 2>/dev/null
  printf 'bash: %s: command not found\\n' "$1" >&2
  return 127
}}
"""
_OBSERVED_MAX_BYTES = 64 << 10
# Host directories visible (read-only) inside: the system's programs and libraries.
DEFAULT_HOST_DIRS: tuple[str, ...] = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt")
# Writable directories (each a per-sandbox host directory bound at this path); the workdir is added.
DEFAULT_WRITABLE_DIRS: tuple[str, ...] = (
    "/logs",
    "/tests",
    "/solution",
    "/tmp",
    "/var/tmp",
    "/root",
    "/installed-agent",
    "/runtime",
)
_PRECREATED_DIRS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")
_STICKY_DIRS = ("/tmp", "/var/tmp")
_RESERVED_TOP = frozenset({"proc", "dev", "sys", "run"})
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The only environment of host-side helper processes (sh, nsenter, setpriv, bwrap).
_HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DRAIN_GRACE_SEC = 0.5
_START_TIMEOUT_SEC = 15.0

# Host side: join the given cgroup.procs files, then exec the rest of argv.
_JOIN_SCRIPT = 'while [ "$1" != "--" ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
# Sandbox init: report readiness (namespaces, mounts and the uid map are complete once this
# runs), close the pipes, and idle; bubblewrap's PID 1 reaps orphans.  Run by bash because dash
# cannot redirect file descriptors above 9.
_INIT_SCRIPT = 'printf R >&"$0"; eval "exec $0>&- $1>&-"; exec sleep infinity'
# Sandbox side of every exec: import the environment from the memfd ($1), cd, run the command
# with ``bash -c`` like Harbor's docker provider.
_EXEC_SCRIPT = (
    'while IFS= read -r -d "" kv; do export -- "$kv" 2>/dev/null; done <&"$1"; '
    'eval "exec $1<&-"; cd -- "$2" || exit 1; exec /bin/bash -c "$3"'
)

OutputCallback = Callable[[str, Literal["stdout", "stderr"]], Awaitable[None]]


class SandboxError(RuntimeError):
    """The sandbox could not be created or used."""


class SandboxUnavailableError(SandboxError):
    """This host lacks something the local sandbox needs (bubblewrap, util-linux, ...)."""


class SandboxPathError(ValueError):
    """A container path is outside the sandbox's writable directories."""


class SandboxExecTimeoutError(RuntimeError):
    """An exec ran past its timeout; all its processes were killed."""

    def __init__(self, timeout_sec: float, stdout: str, stderr: str) -> None:
        # Same wording as Harbor's docker provider, which callers may match on.
        super().__init__(f"Command timed out after {timeout_sec} seconds")
        self.timeout_sec = timeout_sec
        self.stdout = stdout
        self.stderr = stderr


@dataclass(frozen=True)
class SandboxLimits:
    memory_mb: int | None = None
    cpus: float | None = None
    storage_mb: int | None = None
    pids_max: int | None = DEFAULT_PIDS_MAX
    cpu_time_sec: int | None = None  # RLIMIT_CPU per process (optional)


@dataclass
class SandboxExecResult:
    stdout: str
    stderr: str
    return_code: int
    duration_sec: float = 0.0
    truncated: bool = False
    oom_kills: int = 0  # processes of this exec the kernel killed for exceeding memory_mb


@dataclass
class _Tools:
    sh: str
    bwrap: str
    nsenter: str
    setpriv: str
    prlimit: str | None
    bash: str


def _which(name: str) -> str | None:
    return shutil.which(name, path=_HOST_ENV["PATH"])


def find_tools() -> _Tools:
    """Locate the host tools; raise SandboxUnavailableError with an install hint if missing."""
    missing: list[str] = []
    found: dict[str, str | None] = {}
    for name, package in (
        ("sh", "dash"),
        ("bwrap", "bubblewrap"),
        ("nsenter", "util-linux"),
        ("setpriv", "util-linux"),
        ("bash", "bash"),
        ("sleep", "coreutils"),
    ):
        found[name] = _which(name)
        if found[name] is None:
            missing.append(f"{name} (package {package})")
    if missing:
        raise SandboxUnavailableError("the local sandbox needs these host programs: " + ", ".join(missing))
    return _Tools(
        sh=found["sh"] or "",
        bwrap=found["bwrap"] or "",
        nsenter=found["nsenter"] or "",
        setpriv=found["setpriv"] or "",
        prlimit=_which("prlimit"),
        bash=found["bash"] or "",
    )


def normalize_container_path(path: str) -> str:
    if not path or not path.startswith("/"):
        raise SandboxPathError(f"container path must be absolute: {path!r}")
    return posixpath.normpath(path).replace("//", "/")


def container_dir_problem(path: str, host_dirs: Sequence[str] = DEFAULT_HOST_DIRS) -> str | None:
    """Why path cannot be a writable directory of the sandbox (None if it can)."""
    try:
        norm = normalize_container_path(path)
    except SandboxPathError as exc:
        return str(exc)
    if norm == "/":
        return "the root directory cannot be writable"
    top = norm.strip("/").split("/")[0]
    if top in _RESERVED_TOP:
        return f"{norm} is inside /{top}, which the sandbox provides itself"
    if top in host_dirs:
        return f"{norm} is inside the host's read-only /{top}; use a directory such as /app"
    return None


def _top_level(dirs: Sequence[str]) -> list[str]:
    """Drop directories nested inside another one of the list."""
    result: list[str] = []
    for d in sorted(set(dirs), key=lambda p: (p.count("/"), p)):
        if not any(d == r or d.startswith(r + "/") for r in result):
            result.append(d)
    return result


def _kill_pid(pid: int) -> None:
    # os.kill rather than Process.kill(): Popen.send_signal() polls first and would reap the
    # child behind asyncio's child watcher (which then reports exit status 255).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def _process_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def owner_record() -> dict[str, int | str | None]:
    """This process as the owner of what it leaves on the host (a sandbox, a work dir):
    its pid and start time, which a reused pid does not share."""
    pid = os.getpid()
    return {"owner_pid": pid, "owner_start": _process_start_time(pid)}


def owner_alive(record: Mapping[str, object]) -> bool:
    """Whether the process ``owner_record`` described still runs (a zombie does not: it is
    a killed worker child its parent has not reaped yet)."""
    try:
        pid = int(record.get("owner_pid") or 0)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return False
    return pid > 0 and _process_start_time(pid) == record.get("owner_start") and not _is_zombie(pid)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _pid_namespace(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True  # gone


def _namespace_members(namespace: int) -> set[int]:
    """Host pids of the live processes in the PID namespace ``namespace`` (an inode number)."""
    members: set[int] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _pid_namespace(int(entry.name)) == namespace and not _is_zombie(int(entry.name)):
            members.add(int(entry.name))
    return members


def _resolv_conf_target() -> str:
    """Where the sandbox's resolv.conf must be bound: /etc/resolv.conf, or what it links to
    when the host's is a symlink into /run (which is the sandbox's own tmpfs)."""
    path = "/etc/resolv.conf"
    if os.path.islink(path):
        target = os.path.realpath(path)
        if target.startswith("/run/"):
            return target
    return path


_libc = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID = 2
_MS_NODEV = 4
_MNT_DETACH = 2


def _mount_tmpfs(target: Path, size_mb: int, uid: int, gid: int) -> None:
    opts = f"size={int(size_mb)}m,mode=0755,uid={uid},gid={gid}".encode()
    if _libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {target}: {os.strerror(err)}")


def _umount(target: Path) -> None:
    # MNT_DETACH: never fails because of a process still holding a file (it will be gone soon).
    if _libc.umount2(str(target).encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {target}: {os.strerror(err)}")


class Sandbox:
    """One sandbox.  Pure library code: no Django, no Harbor (see environment.py for that)."""

    def __init__(
        self,
        *,
        name: str,
        base_dir: Path,
        workdir: str = "/app",
        limits: SandboxLimits | None = None,
        model_socket: Path | None = None,
        model_port: int = DEFAULT_MODEL_PORT,
        model_max_connections: int = DEFAULT_MAX_CONNECTIONS,
        sandbox_uid: int | None = None,
        host_dirs: Sequence[str] = DEFAULT_HOST_DIRS,
        extra_ro_binds: Sequence[str] = (),
        extra_writable_dirs: Sequence[str] = (),
        storage_backend: Literal["tmpfs", "disk"] = "tmpfs",
        cgroup_parent: str | None = None,
        hostname: str = "sandbox",
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        log: logging.Logger | None = None,
    ) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", name):
            raise ValueError(f"invalid sandbox name {name!r}")
        self.name = name
        self.base_dir = Path(base_dir)
        self.path = self.base_dir / name
        self.fs = self.path / "fs"
        self.workdir = normalize_container_path(workdir)
        self.limits = limits or SandboxLimits()
        self.model_socket = Path(model_socket) if model_socket else None
        self.model_port = int(model_port)
        self.model_max_connections = int(model_max_connections)
        self.host_dirs = tuple(d.strip("/") for d in host_dirs)
        self.extra_ro_binds = tuple(extra_ro_binds)
        self.storage_backend = storage_backend
        self.cgroup_parent = cgroup_parent
        self.hostname = hostname
        self.max_output_bytes = max_output_bytes
        self.log = log or logger
        self.is_root = os.geteuid() == 0
        # As root the sandbox runs as an unprivileged host uid; otherwise as the caller's uid.
        self.uid = (sandbox_uid if sandbox_uid is not None else DEFAULT_SANDBOX_UID) if self.is_root else os.geteuid()
        self.gid = self.uid if self.is_root else os.getegid()
        self._owner = (self.uid, self.gid) if self.is_root else None
        for d in (self.workdir, *extra_writable_dirs):
            problem = container_dir_problem(d, self.host_dirs)
            if problem:
                raise SandboxPathError(f"cannot use {d} as a writable directory: {problem}")
        self.writable_dirs = _top_level(
            [*DEFAULT_WRITABLE_DIRS, *map(normalize_container_path, extra_writable_dirs), self.workdir]
        )
        self.enforced_limits: dict[str, int | float] = {}
        self.unenforced_limits: dict[str, str] = {}
        self.init_pid: int | None = None  # host pid of the sandbox's PID 1
        self._init_start: str | None = None
        self.model_base_url: str | None = None
        self._tools: _Tools | None = None
        self._init_proc: asyncio.subprocess.Process | None = None
        self._cgroup: SandboxCgroup | None = None
        self._bridge: ModelBridge | None = None
        # Names looked up inside (root only: the stub must be created in the network namespace).
        self.dns: DnsRecorder | None = DnsRecorder() if self.is_root else None
        self._init_child: tuple[int, str | None] | None = None  # the init's idle child (pid, start)
        self._tmpfs_mounted = False
        self._exec_ids = itertools.count(1)
        self._started = False
        self._stopped = False

    # ------------------------------------------------------------------ life cycle

    @property
    def running(self) -> bool:
        return (
            self._started and not self._stopped and self._init_proc is not None and self._init_proc.returncode is None
        )

    async def start(self) -> None:
        if self._started:
            raise SandboxError("sandbox already started")
        self._started = True
        self._tools = find_tools()
        try:
            await self._start()
        except BaseException:
            with contextlib.suppress(Exception):
                await self.stop(delete=True)
            raise

    async def _start(self) -> None:
        assert self._tools is not None
        self._prepare_dirs()
        if self.model_socket is not None:
            if not self.model_socket.exists():
                # Not fatal: the proxy may come up later; each connection is then retried.
                self.log.warning("sandbox %s: model socket %s does not exist (yet)", self.name, self.model_socket)
            self._bridge = ModelBridge(self.model_socket, max_connections=self.model_max_connections)
            (self.path / "sock").mkdir(mode=0o755)
            await self._bridge.serve_unix(self.path / "sock" / "model.sock")
        self._setup_cgroup()
        self._write_meta()
        await self._spawn_init()
        if self.dns is not None:
            assert self.init_pid is not None
            await self.dns.serve_in_netns(self.init_pid)
        if self._bridge is not None:
            assert self.init_pid is not None
            try:
                port = await self._bridge.serve_tcp_in_netns(self.init_pid, self.model_port)
            except PermissionError as exc:
                raise SandboxUnavailableError(
                    "the model bridge must enter the sandbox's network namespace, which needs root (CAP_SYS_ADMIN)"
                ) from exc
            self.model_base_url = f"http://127.0.0.1:{port}"
        self._write_meta()
        self.log.info(
            "sandbox %s started (init pid %s); enforced %s; not enforced %s",
            self.name,
            self.init_pid,
            self.enforced_limits,
            self.unenforced_limits,
        )

    def _prepare_dirs(self) -> None:
        if not self.base_dir.exists():
            self.base_dir.mkdir(parents=True, mode=0o711)
            os.chmod(self.base_dir, 0o711)
        if self.is_root:
            # bubblewrap runs as the sandbox uid and must reach the bind sources.
            for parent in [self.base_dir, *self.base_dir.parents]:
                if not os.stat(parent).st_mode & 0o001:
                    raise SandboxError(
                        f"{parent} is not searchable by other users (mode o+x); the sandbox uid must reach "
                        f"{self.base_dir}: choose another base_dir or chmod o+x {parent}"
                    )
        self.path.mkdir(mode=0o711)
        os.chmod(self.path, 0o711)
        self.fs.mkdir(mode=0o755)
        storage = self.limits.storage_mb
        if storage is not None:
            if self.storage_backend != "tmpfs":
                self.unenforced_limits["storage_mb"] = (
                    "storage_backend='disk': writable directories are not size-limited"
                )
            elif not self.is_root:
                self.unenforced_limits["storage_mb"] = "mounting a size-limited tmpfs needs root"
            else:
                try:
                    _mount_tmpfs(self.fs, storage, self.uid, self.gid)
                    self._tmpfs_mounted = True
                    self.enforced_limits["storage_mb"] = storage
                except OSError as exc:
                    self.unenforced_limits["storage_mb"] = str(exc)
        if self._owner is not None:
            os.chown(self.fs, *self._owner)
        for d in [*self.writable_dirs, *_PRECREATED_DIRS]:
            target = self.fs / d.lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            if self._owner is not None:
                p = target
                while p != self.fs:
                    os.chown(p, *self._owner)
                    p = p.parent
        for d in _STICKY_DIRS:
            os.chmod(self.fs / d.lstrip("/"), 0o1777)
        os.chmod(self.fs / "root", 0o700)
        # Outside fs/: neither part of the storage limit nor of anything copied out.
        (self.path / "hooks").mkdir(mode=0o755)
        (self.path / "hooks" / CHECK_HOOK).write_text(_CHECK_HOOK_SCRIPT)
        os.chmod(self.path / "hooks" / CHECK_HOOK, 0o644)
        (self.path / "observed").mkdir(mode=0o755)
        if self._owner is not None:
            os.chown(self.path / "observed", *self._owner)
        if self.dns is not None:
            (self.path / "resolv.conf").write_text(RESOLV_CONF)
            os.chmod(self.path / "resolv.conf", 0o644)

    def _setup_cgroup(self) -> None:
        limits = self.limits
        wanted = {
            "memory_mb": limits.memory_mb,
            "pids_max": limits.pids_max,
            "cpus": limits.cpus,
        }
        try:
            plan = make_plan(detect_hierarchies(self.cgroup_parent))
            if not plan.hierarchies:
                raise OSError("no writable cgroup hierarchy on this host")
            self._cgroup = SandboxCgroup.create(plan, self.name)
        except OSError as exc:
            self.log.warning("sandbox %s: no cgroups (%s); limits are not enforced", self.name, exc)
            for key, value in wanted.items():
                if value is not None:
                    self.unenforced_limits[key] = f"no cgroups: {exc}"
            self.unenforced_limits["process_tracking"] = "no cgroups: a timeout kills the exec's process group only"
            return
        result = self._cgroup.apply_limits(
            memory_bytes=limits.memory_mb * 1024 * 1024 if limits.memory_mb is not None else None,
            pids_max=limits.pids_max,
            cpus=limits.cpus,
        )
        if "memory_bytes" in result.enforced:
            self.enforced_limits["memory_mb"] = int(result.enforced["memory_bytes"]) // (1024 * 1024)
        if "pids_max" in result.enforced:
            self.enforced_limits["pids_max"] = result.enforced["pids_max"]
        if "cpus" in result.enforced:
            self.enforced_limits["cpus"] = result.enforced["cpus"]
        names = {"memory": "memory_mb", "pids": "pids_max", "cpu": "cpus"}
        for controller, reason in result.unenforced.items():
            self.unenforced_limits[names.get(controller, controller)] = reason
        if plan.tracking is None:
            self.unenforced_limits["process_tracking"] = plan.problems.get("tracking", "unavailable")
        if limits.cpu_time_sec is not None:
            if self._tools is not None and self._tools.prlimit:
                self.enforced_limits["cpu_time_sec"] = limits.cpu_time_sec
            else:
                self.unenforced_limits["cpu_time_sec"] = "prlimit (util-linux) not found"

    def _bwrap_args(self, info_fd: int) -> list[str]:
        args = [
            "--unshare-all",
            "--unshare-user",
            "--uid",
            "0",
            "--gid",
            "0",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            self.hostname,
            "--info-fd",
            str(info_fd),
            "--clearenv",
            "--setenv",
            "PATH",
            SANDBOX_PATH,
        ]
        if self.is_root:
            # No nested user namespaces inside (less kernel surface).  bubblewrap implements this
            # with a second, nested user namespace that owns nothing; entering the sandbox then
            # needs capabilities in the outer one, which only host root has (nsenter from a
            # non-root worker would fail), hence root only.
            args.append("--disable-userns")
        for d in self.host_dirs:
            host = Path("/") / d
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), f"/{d}"]
            elif host.is_dir():
                args += ["--ro-bind", str(host), f"/{d}"]
        for spec in self.extra_ro_binds:
            src, _, dst = spec.partition(":")
            args += ["--ro-bind", src, dst or src]
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += ["--perms", "0755", "--size", str(16 << 20), "--tmpfs", "/run"]
        made: set[str] = set()
        for d in self.writable_dirs:
            # Parents that bubblewrap would otherwise create with mode 0700 (e.g. /var for /var/tmp).
            parent = posixpath.dirname(d)
            chain: list[str] = []
            while parent != "/" and parent not in made:
                chain.append(parent)
                parent = posixpath.dirname(parent)
            for p in reversed(chain):
                args += ["--perms", "0755", "--dir", p]
                made.add(p)
            args += ["--bind", str(self.fs / d.lstrip("/")), d]
        if self._bridge is not None:
            args += ["--ro-bind", str(self.path / "sock" / "model.sock"), MODEL_SOCKET_IN_SANDBOX]
        args += ["--ro-bind", str(self.path / "hooks"), HOOKS_IN_SANDBOX]
        args += ["--bind", str(self.path / "observed"), OBSERVED_IN_SANDBOX]
        if self.dns is not None:
            args += ["--ro-bind", str(self.path / "resolv.conf"), _resolv_conf_target()]
        # The root itself is a bubblewrap tmpfs: make it read-only so that only the writable
        # directories (all size-limited together) can be written.
        args += ["--remount-ro", "/", "--chdir", "/"]
        return args

    async def _spawn_init(self) -> None:
        tools = self._tools
        assert tools is not None
        info_r, info_w = os.pipe()
        ready_r, ready_w = os.pipe()
        argv: list[str] = []
        if self._cgroup is not None:
            # The init joins the sandbox cgroup itself (it becomes the root of the sandbox's
            # cgroup namespace); execs go to child cgroups.  No controller is enabled in the
            # sandbox cgroup's subtree_control, so cgroup v2's no-internal-process rule is met.
            argv += [tools.sh, "-c", _JOIN_SCRIPT, "synth-join", *map(str, self._cgroup.procs_files), "--"]
        if self.is_root:
            argv += [tools.setpriv, f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--"]
        argv += [
            tools.bwrap,
            *self._bwrap_args(info_w),
            "--",
            tools.bash,
            "--noprofile",
            "--norc",
            "-c",
            _INIT_SCRIPT,
            str(ready_w),
            str(info_w),
        ]
        log_fd = os.open(self.path / "init.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            # The init's stdout/stderr only ever carry bubblewrap's own error messages.
            self._init_proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                env=_HOST_ENV,
                cwd="/",  # the worker's cwd would show up as PWD of the sandbox's PID 1
                pass_fds=(info_w, ready_w),
                start_new_session=True,
            )
        except BaseException:
            os.close(info_r)
            os.close(ready_r)
            raise
        finally:
            for fd in (info_w, ready_w, log_fd):
                os.close(fd)
        info: dict[str, int] | None = None
        ready = b""
        try:
            async with asyncio.timeout(_START_TIMEOUT_SEC):
                info_data, ready = await asyncio.gather(
                    _read_pipe(info_r, lambda d: d.rstrip().endswith(b"}")),
                    _read_pipe(ready_r, lambda d: len(d) >= 1),
                )
            info = json.loads(info_data)
        except (TimeoutError, ValueError, OSError) as exc:
            self.log.debug("sandbox %s: init did not report: %r", self.name, exc)
        if info is None or ready != b"R" or "child-pid" not in info:
            _kill_pid(self._init_proc.pid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._init_proc.wait(), 5)
            log_text = (self.path / "init.log").read_text(errors="replace").strip()
            raise SandboxError(f"sandbox init failed to start: {log_text or 'no output'}")
        self.init_pid = int(info["child-pid"])
        self._init_start = _process_start_time(self.init_pid)
        # bubblewrap's PID 1 runs the init script as its only child (PID 2), which reported ready
        # above and now idles: the one process besides PID 1 that belongs to no phase.
        children = _children(self.init_pid)
        if len(children) == 1:
            self._init_child = (children[0], _process_start_time(children[0]))

    def _write_meta(self, *, kept: bool = False) -> None:
        meta = {
            "kept": kept,
            **owner_record(),
            "init_pid": self.init_pid,
            "cgroups": [str(d) for d in self._cgroup.dirs.values()] if self._cgroup and not kept else [],
            "tmpfs": self._tmpfs_mounted and not kept,
            "model_base_url": self.model_base_url,
            "enforced_limits": self.enforced_limits,
            "unenforced_limits": self.unenforced_limits,
        }
        tmp = self.path / "meta.json.tmp"
        tmp.write_text(json.dumps(meta, indent=2))
        os.chmod(tmp, 0o600)
        tmp.replace(self.path / "meta.json")

    async def stop(self, delete: bool = True) -> None:
        """Kill everything, remove cgroups and (with delete) the sandbox directory. Idempotent."""
        if not self._stopped:
            self._stopped = True
            if self._bridge is not None:
                await self._bridge.close()
            if self.dns is not None:
                self.dns.close()
            # Kill the sandbox's PID 1 first: the kernel then kills every process of the PID
            # namespace, and bubblewrap's outer process (our child) reaps it and exits.  Killing
            # everything at once instead would orphan PID 1's zombie to the host's init.
            # (Only if the pid is still that process: it is a grandchild, so it may have died
            # and its pid been reused.)
            if self.init_pid is not None and _process_start_time(self.init_pid) == self._init_start:
                _kill_pid(self.init_pid)
            if self._init_proc is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._init_proc.wait()), 2)
            # Then whatever is left in the cgroup tree (exec helpers on the host side).
            if self._cgroup is not None:
                await self._cgroup.kill()
            if self._init_proc is not None and self._init_proc.returncode is None:
                # Without cgroups this is what ends the sandbox: --die-with-parent kills its
                # PID 1, and the kernel kills every process of a PID namespace whose init dies.
                _kill_pid(self._init_proc.pid)
            if self._init_proc is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._init_proc.wait(), 10)
            if self._tmpfs_mounted:
                await asyncio.to_thread(self._unmount_storage, keep=not delete)
            if self._cgroup is not None:
                failures = self._cgroup.remove()
                if failures:
                    self.log.warning("sandbox %s: cgroups not removed: %s", self.name, failures)
                self._cgroup.remove_parents_if_empty()
            if not delete and self.path.exists():
                # Nothing runs or is mounted any more: reap_stale_sandboxes leaves it alone.
                self._write_meta(kept=True)
        if delete and self.path.exists():
            await asyncio.to_thread(shutil.rmtree, self.path, True)

    def _unmount_storage(self, *, keep: bool) -> None:
        if keep:
            # The tmpfs would pin memory until someone unmounts it: keep a copy on disk instead.
            saved = self.path / "fs.saved"
            shutil.copytree(self.fs, saved, symlinks=True, ignore_dangling_symlinks=True)
        try:
            _umount(self.fs)
        except OSError as exc:
            self.log.warning("sandbox %s: %s", self.name, exc)
            return
        self._tmpfs_mounted = False
        if keep:
            self.fs.rmdir()
            (self.path / "fs.saved").rename(self.fs)

    # ------------------------------------------------------------------ exec

    async def exec(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_sec: float | None = None,
        on_output: OutputCallback | None = None,
        kill_leftovers: bool = False,
    ) -> SandboxExecResult:
        """Run ``bash -c command`` in the sandbox (as its root), like ``docker exec``.

        Returns when the command's main process exits; background processes it started keep
        running (docker semantics) until ``stop()``, unless ``kill_leftovers`` (a Dockerfile
        ``RUN``, whose processes end with its build step).  On timeout or cancellation every
        process the exec started is killed; a timeout raises SandboxExecTimeoutError.
        """
        if not self.running or self.init_pid is None or self._tools is None:
            raise SandboxError(f"sandbox {self.name} is not running")
        tools = self._tools
        started = time.monotonic()
        oom_before = self.oom_kills() or 0
        exec_cgroup = self._cgroup.child(f"exec-{next(self._exec_ids)}") if self._cgroup is not None else None
        full_env = {"PATH": SANDBOX_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash"}
        full_env.update({"LANG": "C.UTF-8", "TERM": "xterm", "HOSTNAME": self.hostname})
        for key, value in (env or {}).items():
            if not _ENV_NAME.match(key):
                self.log.warning("sandbox %s: skipping invalid environment variable name %r", self.name, key)
                continue
            full_env[key] = str(value)
        env_fd = os.memfd_create("synth-exec-env", os.MFD_CLOEXEC)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            payload = b"".join(f"{k}={v}".encode() + b"\0" for k, v in full_env.items() if "\0" not in v)
            os.write(env_fd, payload)
            os.lseek(env_fd, 0, os.SEEK_SET)
            argv: list[str] = []
            if exec_cgroup is not None:
                argv += [tools.sh, "-c", _JOIN_SCRIPT, "synth-join", *map(str, exec_cgroup.procs_files), "--"]
            if self.is_root:
                # All namespaces; nsenter switches to uid/gid 0 of the user namespace, i.e. the
                # unprivileged sandbox uid on the host.
                argv += [tools.nsenter, "-t", str(self.init_pid), "--all", "--"]
            else:
                # Unprivileged: the caller's uid already is the sandbox's root; setgroups is
                # denied in such a user namespace and the time namespace cannot be joined.
                ns = ["-U", "--preserve-credentials", "-m", "-u", "-i", "-n", "-p", "-C"]
                argv += [tools.nsenter, "-t", str(self.init_pid), *ns, "--"]
            argv += [tools.setpriv, "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--"]
            if tools.prlimit:
                argv += [tools.prlimit, "--core=0"]
                if self.limits.cpu_time_sec is not None:
                    argv.append(f"--cpu={int(self.limits.cpu_time_sec)}")
                argv.append("--")
            argv += [
                tools.bash,
                "--noprofile",
                "--norc",
                "-c",
                _EXEC_SCRIPT,
                "synth-exec",
                str(env_fd),
                cwd or self.workdir,
                command,
            ]
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                env=_HOST_ENV,
                cwd="/",  # the worker's cwd would show up as PWD of the sandbox's PID 1
                pass_fds=(env_fd,),
                start_new_session=True,
            )
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            if exec_cgroup is not None:
                exec_cgroup.remove()
            raise
        finally:
            for fd in (env_fd, out_w, err_w):
                os.close(fd)

        out = _Capture(out_r, "stdout", self.max_output_bytes, on_output)
        err = _Capture(err_r, "stderr", self.max_output_bytes, on_output)
        readers = [asyncio.ensure_future(out.run()), asyncio.ensure_future(err.run())]
        try:
            if timeout_sec is not None and timeout_sec > 0:
                await asyncio.wait_for(proc.wait(), timeout_sec)
            else:
                await proc.wait()
        except TimeoutError:
            self._kill_exec_now(proc, exec_cgroup)
            await _finish_readers(readers, out, err)
            await self._reap_exec(proc, exec_cgroup)
            raise SandboxExecTimeoutError(timeout_sec or 0, out.text(), err.text()) from None
        except BaseException:
            # Cancelled (e.g. Harbor's agent timeout around agent.run): kill synchronously first,
            # so that nothing survives even if the clean-up below is cancelled again.
            self._kill_exec_now(proc, exec_cgroup)
            with contextlib.suppress(BaseException):
                await asyncio.shield(_finish_readers(readers, out, err, grace=0))
            with contextlib.suppress(BaseException):
                await asyncio.shield(self._reap_exec(proc, exec_cgroup))
            raise
        await _finish_readers(readers, out, err)
        # OOM kills are counted by the sandbox's memory cgroup; the difference over this exec is
        # attributed to it (approximate when execs run concurrently).
        oom_kills = max(0, (self.oom_kills() or 0) - oom_before)
        if exec_cgroup is not None and kill_leftovers and not exec_cgroup.is_empty():
            await exec_cgroup.kill()
        if exec_cgroup is not None and exec_cgroup.is_empty():
            exec_cgroup.remove()
        rc = proc.returncode if proc.returncode is not None else -1
        # nsenter re-raises the signal that killed the command: report it like a shell (137 = SIGKILL).
        return_code = 128 - rc if rc < 0 else rc
        return SandboxExecResult(
            stdout=out.text(),
            stderr=err.text(),
            return_code=return_code,
            duration_sec=time.monotonic() - started,
            truncated=out.dropped > 0 or err.dropped > 0,
            oom_kills=oom_kills,
        )

    def _kill_exec_now(self, proc: asyncio.subprocess.Process, exec_cgroup: SandboxCgroup | None) -> None:
        if exec_cgroup is not None:
            exec_cgroup.kill_now()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    async def _reap_exec(self, proc: asyncio.subprocess.Process, exec_cgroup: SandboxCgroup | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)
        if exec_cgroup is not None and await exec_cgroup.kill():
            exec_cgroup.remove()

    async def end_processes(self, *, attempts: int = 50) -> int:
        """Kill every process of the sandbox but its init: a phase (the agent's) is over.

        Whatever a process did to escape (a new session or process group, a double fork,
        ``nohup``, ignoring SIGTERM), it is still in the sandbox's PID namespace and in an exec's
        cgroup: both are searched, exec cgroups are killed whole (frozen first, so a forking
        process cannot outrun the kill), then every member of the namespace but PID 1 and its
        idle child. Returns how many processes were killed; raises SandboxError if any survive.
        """
        if self.init_pid is None:
            return 0
        namespace = _pid_namespace(self.init_pid)
        keep = {self.init_pid}
        if self._init_child is not None and _process_start_time(self._init_child[0]) == self._init_child[1]:
            keep.add(self._init_child[0])
        if self._init_proc is not None:
            keep.add(self._init_proc.pid)  # bubblewrap's outer process, in the host's namespace
        killed: set[int] = set()
        for _ in range(attempts):
            members = _namespace_members(namespace) if namespace is not None else set()
            victims = (members | self.pids()) - keep
            victims = {pid for pid in victims if not _is_zombie(pid)}
            if not victims:
                return len(killed)
            killed |= victims
            if self._cgroup is not None:
                for child in self._cgroup.children():
                    child.kill_now()
            for pid in victims:
                _kill_pid(pid)
            await asyncio.sleep(0.01)
        raise SandboxError(f"sandbox {self.name}: processes survive the end of the phase: {sorted(victims)}")

    def observed_reset(self) -> None:
        """Forget what the phase hooks observed so far (a new phase starts)."""
        with contextlib.suppress(FileNotFoundError):
            (self.path / "observed" / "missing-commands").unlink()

    def missing_commands(self) -> list[str]:
        """Commands that bash could not find in a phase using CHECK_HOOK (in order, once each)."""
        # The sandbox writes this file: never follow a link it made, never block on a FIFO.
        try:
            fd = os.open(self.path / "observed" / "missing-commands", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return []
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return []
            data = f.read(_OBSERVED_MAX_BYTES)
        names = (line.strip() for line in data.decode(errors="replace").splitlines())
        return list(dict.fromkeys(name[:200] for name in names if name))

    def pids(self) -> set[int]:
        """Host pids of every process of the sandbox (empty without cgroup tracking)."""
        return self._cgroup.pids() if self._cgroup is not None else set()

    def oom_kills(self) -> int | None:
        """Processes OOM-killed in this sandbox so far (None: not measurable on this host)."""
        return self._cgroup.oom_kills() if self._cgroup is not None else None

    # ------------------------------------------------------------------ files

    def host_path(self, container_path: str) -> Path:
        """The host path backing a container path inside a writable directory."""
        root, parts = self._locate(container_path)
        return root.joinpath(*parts)

    def _locate(self, container_path: str) -> tuple[Path, list[str]]:
        norm = normalize_container_path(container_path)
        for d in self.writable_dirs:
            if norm == d or norm.startswith(d + "/"):
                return self.fs, [p for p in norm.split("/") if p]
        raise SandboxPathError(
            f"{container_path} is outside the sandbox's writable directories ({', '.join(self.writable_dirs)})"
        )

    def _split_parent(self, container_path: str) -> tuple[Path, list[str], str]:
        root, parts = self._locate(container_path)
        if len(parts) < 2 or "/" + "/".join(parts) in self.writable_dirs:
            raise SandboxPathError(f"{container_path} is a sandbox directory, not a file")
        return root, parts[:-1], parts[-1]

    async def upload_file(self, source: Path | str, target: str) -> None:
        root, parents, name = self._split_parent(target)

        def run() -> None:
            with hostfs.closing_fd(hostfs.open_dir(root, parents, create=True, owner=self._owner)) as dir_fd:
                hostfs.write_file(dir_fd, name, Path(source), self._owner)

        await asyncio.to_thread(run)

    async def upload_dir(self, source: Path | str, target: str) -> None:
        root, parts = self._locate(target)
        if not Path(source).is_dir():
            raise NotADirectoryError(f"{source} is not a directory")

        def run() -> None:
            with hostfs.closing_fd(hostfs.open_dir(root, parts, create=True, owner=self._owner)) as dir_fd:
                hostfs.copy_tree_in(Path(source), dir_fd, self._owner)

        await asyncio.to_thread(run)

    async def make_dir(self, target: str) -> None:
        """``mkdir -p`` of a directory inside a writable directory (symlinks in the way replaced)."""
        root, parts = self._locate(target)

        def run() -> None:
            os.close(hostfs.open_dir(root, parts, create=True, owner=self._owner))

        await asyncio.to_thread(run)

    async def is_dir(self, target: str) -> bool:
        """Whether a path inside a writable directory is a directory (never through a symlink)."""
        root, parts = self._locate(target)

        def run() -> bool:
            try:
                os.close(hostfs.open_dir(root, parts, create=False, owner=None))
            except OSError:
                return False
            return True

        return await asyncio.to_thread(run)

    async def export_files(self, target: Path) -> None:
        """Copy every writable directory's content to the host directory target, symlinks kept
        as symlinks (never followed).  Only while nothing runs in the sandbox that could change
        the tree underneath (e.g. between build steps)."""

        def run() -> None:
            with hostfs.closing_fd(os.open(self.fs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)) as fd:
                hostfs.snapshot_tree(fd, Path(target))

        await asyncio.to_thread(run)

    async def import_files(self, source: Path) -> None:
        """Merge a tree made by export_files (with the same writable directories) into this sandbox."""

        def run() -> None:
            with hostfs.closing_fd(hostfs.open_dir(self.fs, [], create=False, owner=None)) as fd:
                hostfs.copy_tree_in(Path(source), fd, self._owner)

        await asyncio.to_thread(run)

    async def download_file(self, source: str, target: Path | str) -> None:
        root, parents, name = self._split_parent(source)

        def run() -> None:
            try:
                dir_fd = hostfs.open_dir(root, parents, create=False, owner=None)
            except hostfs.UnsafePathError as exc:
                raise FileNotFoundError(f"{source} does not exist in the sandbox (or is behind a symlink)") from exc
            with hostfs.closing_fd(dir_fd):
                try:
                    hostfs.read_file(dir_fd, name, Path(target))
                except hostfs.UnsafePathError as exc:
                    raise FileNotFoundError(f"{source}: {exc}") from exc

        await asyncio.to_thread(run)

    async def download_dir(self, source: str, target: Path | str) -> None:
        root, parts = self._locate(source)

        def run() -> None:
            try:
                dir_fd = hostfs.open_dir(root, parts, create=False, owner=None)
            except hostfs.UnsafePathError as exc:
                raise FileNotFoundError(f"{source} is not a directory in the sandbox") from exc
            with hostfs.closing_fd(dir_fd):
                hostfs.copy_tree_out(dir_fd, Path(target))

        await asyncio.to_thread(run)


async def _read_pipe(fd: int, complete: Callable[[bytes], bool]) -> bytes:
    """Read fd (taking ownership) until complete(data) or EOF."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    pipe = os.fdopen(fd, "rb", buffering=0)
    try:
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    except BaseException:
        pipe.close()
        raise
    data = b""
    try:
        while not complete(data):
            chunk = await reader.read(4096)
            if not chunk:
                break
            data += chunk
        return data
    finally:
        transport.close()


class _Capture:
    """Reads one output pipe of an exec, keeping at most limit bytes."""

    def __init__(
        self, fd: int, stream: Literal["stdout", "stderr"], limit: int, callback: OutputCallback | None
    ) -> None:
        self.fd: int | None = fd  # owned until run() hands it to a transport
        self.stream = stream
        self.limit = limit
        self.callback = callback
        self.data = bytearray()
        self.dropped = 0
        self.transport: asyncio.ReadTransport | None = None

    async def run(self) -> None:
        assert self.fd is not None
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        pipe = os.fdopen(self.fd, "rb", buffering=0)
        self.fd = None
        try:
            transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        except BaseException:
            pipe.close()
            raise
        self.transport = transport
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            while chunk := await reader.read(1 << 16):
                room = self.limit - len(self.data)
                if room > 0:
                    self.data += chunk[:room]
                self.dropped += max(0, len(chunk) - max(room, 0))
                if self.callback is not None:
                    text = decoder.decode(chunk)
                    if text:
                        await self.callback(text, self.stream)
        finally:
            transport.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.transport is not None:
            self.transport.close()

    def text(self) -> str:
        text = self.data.decode(errors="replace")
        if self.dropped:
            text += f"\n[output truncated: {self.dropped} bytes dropped]"
        return text


async def _finish_readers(
    readers: list[asyncio.Future[None]], *captures: _Capture, grace: float = _DRAIN_GRACE_SEC
) -> None:
    """Collect output after the main process exited.

    Background processes may keep the pipes open forever; after a short grace period the
    pipes are closed on our side (what the command printed before exiting is already read).
    """
    if grace > 0:
        _done, pending = await asyncio.wait(readers, timeout=grace)
    else:
        pending = {r for r in readers if not r.done()}
    for reader in pending:
        reader.cancel()
    for reader in readers:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
    for capture in captures:
        capture.close()


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
                _umount(sandbox_dir / "fs")
        for cg in cgroups:
            for dirpath, _d, _f in os.walk(cg, topdown=False):
                with contextlib.suppress(OSError):
                    Path(dirpath).rmdir()
        shutil.rmtree(sandbox_dir, ignore_errors=True)
        removed.append(sandbox_dir.name)
    return removed
