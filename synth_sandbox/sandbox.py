"""A local sandbox: bubblewrap namespaces + cgroups, one long-lived init, docker-exec-like execs.

Life cycle
----------
``start()`` creates the sandbox's host directory (mounts.py has its layout) and then starts one
*init* with bubblewrap: ``bwrap --unshare-all --unshare-user --uid 0 ... -- bash -c '... sleep
infinity'``, whose mounts are described in mounts.py.

Every ``exec`` enters that init's namespaces with ``nsenter --all`` (like ``docker exec`` into
a running container): execs share the file system, the process table and the loopback
network with each other and with background processes they leave behind.  The alternative,
one ``bwrap`` per exec, would give every command a fresh PID and network namespace, so a
server or ``tmux`` started by one exec could not be reached by the next one (execs.py).

``stop()`` kills the init, whose death takes down its PID namespace, then whatever is left in
the cgroup tree (limits.py), and removes the sandbox.

Privileges
----------
As host root the init is started as an unprivileged host uid (``sandbox_uid``, default
2000000000) that is mapped to uid 0 *inside* a user namespace: tasks see themselves as root,
but to the host kernel they are that uid, with no capabilities outside the namespace, so the
host's root-only files (``/etc/shadow``, ``/root``) are unreadable and nothing of the host is
writable even through a remount.  Execs enter the user namespace too, and then drop every
capability (``setpriv --bounding-set=-all --no-new-privs``) so they have exactly the
privileges of bubblewrap's own child.  ``--disable-userns`` forbids nested user namespaces.

The names other code uses (errors, limits, paths, owner records, reap_stale_sandboxes) are
importable from here as well as from their own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from synth_sandbox import hooks
from synth_sandbox.bridge import DEFAULT_MAX_CONNECTIONS, ModelBridge
from synth_sandbox.cgroups import SandboxCgroup
from synth_sandbox.dns import DnsRecorder
from synth_sandbox.errors import (
    SandboxError,
    SandboxExecTimeoutError,
    SandboxPathError,
    SandboxUnavailableError,
)
from synth_sandbox.execs import (
    DEFAULT_MAX_OUTPUT_BYTES,
    JOIN_SCRIPT,
    OutputCallback,
    SandboxExecResult,
    exec_run,
    read_pipe,
)
from synth_sandbox.files import SandboxFiles
from synth_sandbox.hooks import CHECK_HOOK, HOOKS_IN_SANDBOX, OBSERVED_IN_SANDBOX
from synth_sandbox.limits import DEFAULT_PIDS_MAX, SandboxLimits, cgroup_limits_apply, storage_limit_apply
from synth_sandbox.mounts import bwrap_args, sandbox_dir_make, sandbox_tree_make, umount
from synth_sandbox.owners import owner_alive, owner_record, reap_stale_sandboxes, sandbox_meta_write
from synth_sandbox.paths import (
    DEFAULT_HOST_DIRS,
    DEFAULT_WRITABLE_DIRS,
    MODEL_SOCKET_IN_SANDBOX,
    SANDBOX_PATH,
    container_dir_problem,
    normalize_container_path,
    top_level,
)
from synth_sandbox.processes import (
    HOST_ENV,
    HostTools,
    children,
    find_tools,
    is_zombie,
    kill_pid,
    namespace_members,
    pid_namespace,
    process_start_time,
)

__all__ = [
    "CHECK_HOOK",
    "DEFAULT_HOST_DIRS",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_MODEL_PORT",
    "DEFAULT_PIDS_MAX",
    "DEFAULT_SANDBOX_UID",
    "DEFAULT_WRITABLE_DIRS",
    "HOOKS_IN_SANDBOX",
    "MODEL_SOCKET_IN_SANDBOX",
    "OBSERVED_IN_SANDBOX",
    "SANDBOX_PATH",
    "OutputCallback",
    "Sandbox",
    "SandboxError",
    "SandboxExecResult",
    "SandboxExecTimeoutError",
    "SandboxLimits",
    "SandboxPathError",
    "SandboxUnavailableError",
    "container_dir_problem",
    "find_tools",
    "normalize_container_path",
    "owner_alive",
    "owner_record",
    "reap_stale_sandboxes",
]

logger = logging.getLogger(__name__)

DEFAULT_SANDBOX_UID = 2_000_000_000
DEFAULT_MODEL_PORT = 18080
_START_TIMEOUT_SEC = 15.0

# Sandbox init: report readiness (namespaces, mounts and the uid map are complete once this
# runs), close the pipes, and idle; bubblewrap's PID 1 reaps orphans.  Run by bash because dash
# cannot redirect file descriptors above 9.
_INIT_SCRIPT = 'printf R >&"$0"; eval "exec $0>&- $1>&-"; exec sleep infinity'


class Sandbox(SandboxFiles):
    """One sandbox.  Pure library code: no Django, no Harbor (see environment.py for that).

    File transfer (upload_*, download_*, make_dir, is_dir, export_files, import_files,
    host_path) comes from SandboxFiles."""

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
        for d in (self.workdir, *extra_writable_dirs):
            problem = container_dir_problem(d, self.host_dirs)
            if problem:
                raise SandboxPathError(f"cannot use {d} as a writable directory: {problem}")
        super().__init__(
            fs=self.path / "fs",
            writable_dirs=top_level(
                [*DEFAULT_WRITABLE_DIRS, *map(normalize_container_path, extra_writable_dirs), self.workdir]
            ),
            owner=(self.uid, self.gid) if self.is_root else None,
        )
        self.enforced_limits: dict[str, int | float] = {}
        self.unenforced_limits: dict[str, str] = {}
        self.init_pid: int | None = None  # host pid of the sandbox's PID 1
        self._init_start: str | None = None
        self.model_base_url: str | None = None
        self._tools: HostTools | None = None
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
        sandbox_dir_make(base_dir=self.base_dir, sandbox_dir=self.path, is_root=self.is_root)
        self._tmpfs_mounted = storage_limit_apply(
            fs=self.fs,
            storage_mb=self.limits.storage_mb,
            storage_backend=self.storage_backend,
            is_root=self.is_root,
            uid=self.uid,
            gid=self.gid,
            enforced=self.enforced_limits,
            unenforced=self.unenforced_limits,
        )
        sandbox_tree_make(
            sandbox_dir=self.path, writable_dirs=self.writable_dirs, owner=self._owner, resolv_conf=self.dns is not None
        )

    def _setup_cgroup(self) -> None:
        self._cgroup = cgroup_limits_apply(
            name=self.name,
            limits=self.limits,
            cgroup_parent=self.cgroup_parent,
            log=self.log,
            enforced=self.enforced_limits,
            unenforced=self.unenforced_limits,
        )

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
            argv += [tools.sh, "-c", JOIN_SCRIPT, "synth-join", *map(str, self._cgroup.procs_files), "--"]
        if self.is_root:
            argv += [tools.setpriv, f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--"]
        argv += [
            tools.bwrap,
            *bwrap_args(
                sandbox_dir=self.path,
                info_fd=info_w,
                hostname=self.hostname,
                is_root=self.is_root,
                host_dirs=self.host_dirs,
                extra_ro_binds=self.extra_ro_binds,
                writable_dirs=self.writable_dirs,
                model_socket=self._bridge is not None,
                resolv_conf=self.dns is not None,
            ),
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
                env=HOST_ENV,
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
                    read_pipe(info_r, lambda d: d.rstrip().endswith(b"}")),
                    read_pipe(ready_r, lambda d: len(d) >= 1),
                )
            info = json.loads(info_data)
        except (TimeoutError, ValueError, OSError) as exc:
            self.log.debug("sandbox %s: init did not report: %r", self.name, exc)
        if info is None or ready != b"R" or "child-pid" not in info:
            kill_pid(self._init_proc.pid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._init_proc.wait(), 5)
            log_text = (self.path / "init.log").read_text(errors="replace").strip()
            raise SandboxError(f"sandbox init failed to start: {log_text or 'no output'}")
        self.init_pid = int(info["child-pid"])
        self._init_start = process_start_time(self.init_pid)
        # bubblewrap's PID 1 runs the init script as its only child (PID 2), which reported ready
        # above and now idles: the one process besides PID 1 that belongs to no phase.
        children_ = children(self.init_pid)
        if len(children_) == 1:
            self._init_child = (children_[0], process_start_time(children_[0]))

    def _write_meta(self, *, kept: bool = False) -> None:
        sandbox_meta_write(
            sandbox_dir=self.path,
            kept=kept,
            init_pid=self.init_pid,
            cgroup_dirs=list(self._cgroup.dirs.values()) if self._cgroup else [],
            tmpfs=self._tmpfs_mounted,
            model_base_url=self.model_base_url,
            enforced_limits=self.enforced_limits,
            unenforced_limits=self.unenforced_limits,
        )

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
            if self.init_pid is not None and process_start_time(self.init_pid) == self._init_start:
                kill_pid(self.init_pid)
            if self._init_proc is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._init_proc.wait()), 2)
            # Then whatever is left in the cgroup tree (exec helpers on the host side).
            if self._cgroup is not None:
                await self._cgroup.kill()
            if self._init_proc is not None and self._init_proc.returncode is None:
                # Without cgroups this is what ends the sandbox: --die-with-parent kills its
                # PID 1, and the kernel kills every process of a PID namespace whose init dies.
                kill_pid(self._init_proc.pid)
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
            umount(self.fs)
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
        return await exec_run(
            name=self.name,
            tools=self._tools,
            init_pid=self.init_pid,
            is_root=self.is_root,
            hostname=self.hostname,
            cgroup=self._cgroup,
            exec_id=next(self._exec_ids),
            command=command,
            cwd=cwd or self.workdir,
            env=env,
            cpu_time_sec=self.limits.cpu_time_sec,
            timeout_sec=timeout_sec,
            on_output=on_output,
            kill_leftovers=kill_leftovers,
            max_output_bytes=self.max_output_bytes,
            oom_kills=self.oom_kills,
            log=self.log,
        )

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
        namespace = pid_namespace(self.init_pid)
        keep = {self.init_pid}
        if self._init_child is not None and process_start_time(self._init_child[0]) == self._init_child[1]:
            keep.add(self._init_child[0])
        if self._init_proc is not None:
            keep.add(self._init_proc.pid)  # bubblewrap's outer process, in the host's namespace
        killed: set[int] = set()
        for _ in range(attempts):
            members = namespace_members(namespace) if namespace is not None else set()
            victims = (members | self.pids()) - keep
            victims = {pid for pid in victims if not is_zombie(pid)}
            if not victims:
                return len(killed)
            killed |= victims
            if self._cgroup is not None:
                for child in self._cgroup.children():
                    child.kill_now()
            for pid in victims:
                kill_pid(pid)
            await asyncio.sleep(0.01)
        raise SandboxError(f"sandbox {self.name}: processes survive the end of the phase: {sorted(victims)}")

    def observed_reset(self) -> None:
        """Forget what the phase hooks observed so far (a new phase starts)."""
        hooks.observed_reset(sandbox_dir=self.path)

    def missing_commands(self) -> list[str]:
        """Commands that bash could not find in a phase using CHECK_HOOK (in order, once each)."""
        return hooks.missing_commands(sandbox_dir=self.path)

    def pids(self) -> set[int]:
        """Host pids of every process of the sandbox (empty without cgroup tracking)."""
        return self._cgroup.pids() if self._cgroup is not None else set()

    def oom_kills(self) -> int | None:
        """Processes OOM-killed in this sandbox so far (None: not measurable on this host)."""
        return self._cgroup.oom_kills() if self._cgroup is not None else None
