"""One exec in a running sandbox: enter the init's namespaces, run ``bash -c``, capture output.

Every exec enters the sandbox's init with ``nsenter`` (like ``docker exec`` into a running
container), drops every capability (``setpriv --bounding-set=-all --no-new-privs``) so that it
has exactly the privileges of bubblewrap's own child, and runs in its own child cgroup, so that
a timeout or a cancellation kills exactly the processes it started.

Environment: no variable of the worker reaches the sandbox.  Host-side helper processes run
with a fixed ``PATH`` only (so ``LD_PRELOAD`` & co. in a task's env can never affect a process
running as host root), and the sandbox environment is handed to the innermost shell through a
memfd, which also keeps secrets such as API keys out of every process's command line.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from synth_sandbox.cgroups import SandboxCgroup
from synth_sandbox.errors import SandboxExecTimeoutError
from synth_sandbox.paths import SANDBOX_PATH
from synth_sandbox.processes import HOST_ENV, HostTools

DEFAULT_MAX_OUTPUT_BYTES = 32 << 20
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DRAIN_GRACE_SEC = 0.5

# Host side: join the given cgroup.procs files, then exec the rest of argv.
JOIN_SCRIPT = 'while [ "$1" != "--" ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
# Sandbox side of every exec: no core dumps and the CPU-time limit ($4, if any), set by bash's
# own ulimit (soft and hard) rather than a prlimit process in the chain, so the limits hold on
# a host without prlimit. Then join the sandbox's cpu cgroup through the descriptor $5 the host
# opened (if any; see SandboxCgroup.cpu_procs_file): the helpers before this shell (sh,
# nsenter, setpriv and this bash's start) cost about 5 ms of CPU per exec; on a task's quarter
# of a CPU, back-to-back execs of ``true`` took 25 ms each on average with them on the quota,
# 8.5 ms with the late join. Then import the
# environment from the memfd ($1), close both descriptors, cd, and run the command with
# ``bash -c`` like Harbor's docker provider.
_EXEC_SCRIPT = (
    'ulimit -c 0 && { [ -z "$4" ] || ulimit -t "$4"; } || exit 1; '
    '[ -z "$5" ] || { echo 0 >&"$5" && eval "exec $5>&-"; } '
    '|| { echo "synth-exec: cannot join the sandbox cpu cgroup" >&2; exit 125; }; '
    'while IFS= read -r -d "" kv; do export -- "$kv" 2>/dev/null; done <&"$1"; '
    'eval "exec $1<&-"; cd -- "$2" || exit 1; exec /bin/bash -c "$3"'
)

OutputCallback = Callable[[str, Literal["stdout", "stderr"]], Awaitable[None]]


@dataclass
class SandboxExecResult:
    stdout: str
    stderr: str
    return_code: int
    duration_sec: float = 0.0
    truncated: bool = False
    oom_kills: int = 0  # processes of this exec the kernel killed for exceeding memory_mb


def _exec_env(*, name: str, hostname: str, env: Mapping[str, str] | None, log: logging.Logger) -> dict[str, str]:
    full_env = {"PATH": SANDBOX_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash"}
    full_env.update({"LANG": "C.UTF-8", "TERM": "xterm", "HOSTNAME": hostname})
    for key, value in (env or {}).items():
        if not _ENV_NAME.match(key):
            log.warning("sandbox %s: skipping invalid environment variable name %r", name, key)
            continue
        full_env[key] = str(value)
    return full_env


def _exec_argv(
    *,
    tools: HostTools,
    init_pid: int,
    is_root: bool,
    exec_cgroup: SandboxCgroup | None,
    cpu_time_sec: int | None,
    env_fd: int,
    cpu_fd: int | None,
    cwd: str,
    command: str,
) -> list[str]:
    argv: list[str] = []
    if exec_cgroup is not None:
        late = exec_cgroup.cpu_procs_file if cpu_fd is not None else None
        early = [str(f) for f in exec_cgroup.procs_files if f != late]
        argv += [tools.sh, "-c", JOIN_SCRIPT, "synth-join", *early, "--"]
    if is_root:
        # All namespaces; nsenter switches to uid/gid 0 of the user namespace, i.e. the
        # unprivileged sandbox uid on the host.
        argv += [tools.nsenter, "-t", str(init_pid), "--all", "--"]
    else:
        # Unprivileged: the caller's uid already is the sandbox's root; setgroups is
        # denied in such a user namespace and the time namespace cannot be joined.
        ns = ["-U", "--preserve-credentials", "-m", "-u", "-i", "-n", "-p", "-C"]
        argv += [tools.nsenter, "-t", str(init_pid), *ns, "--"]
    argv += [tools.setpriv, "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--"]
    cpu_limit = str(int(cpu_time_sec)) if cpu_time_sec is not None else ""
    argv += [
        tools.bash,
        "--noprofile",
        "--norc",
        "-c",
        _EXEC_SCRIPT,
        "synth-exec",
        str(env_fd),
        cwd,
        command,
        cpu_limit,
        "" if cpu_fd is None else str(cpu_fd),
    ]
    return argv


async def exec_run(
    *,
    name: str,
    tools: HostTools,
    init_pid: int,
    is_root: bool,
    hostname: str,
    cgroup: SandboxCgroup | None,
    exec_id: int,
    command: str,
    cwd: str,
    env: Mapping[str, str] | None,
    cpu_time_sec: int | None,
    timeout_sec: float | None,
    on_output: OutputCallback | None,
    kill_leftovers: bool,
    max_output_bytes: int,
    oom_kills: Callable[[], int | None],
    log: logging.Logger,
) -> SandboxExecResult:
    """Run ``bash -c command`` in the sandbox whose init is init_pid (see Sandbox.exec),
    in a child cgroup ``exec-<exec_id>`` of the sandbox's cgroup."""
    started = time.monotonic()
    oom_before = oom_kills() or 0
    exec_cgroup = cgroup.child(f"exec-{exec_id}") if cgroup is not None else None
    full_env = _exec_env(name=name, hostname=hostname, env=env, log=log)
    env_fd = os.memfd_create("synth-exec-env", os.MFD_CLOEXEC)
    cpu_fd: int | None = None
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        if exec_cgroup is not None and (cpu_file := exec_cgroup.cpu_procs_file) is not None:
            cpu_fd = os.open(cpu_file, os.O_WRONLY | os.O_CLOEXEC)
        payload = b"".join(f"{k}={v}".encode() + b"\0" for k, v in full_env.items() if "\0" not in v)
        os.write(env_fd, payload)
        os.lseek(env_fd, 0, os.SEEK_SET)
        argv = _exec_argv(
            tools=tools,
            init_pid=init_pid,
            is_root=is_root,
            exec_cgroup=exec_cgroup,
            cpu_time_sec=cpu_time_sec,
            env_fd=env_fd,
            cpu_fd=cpu_fd,
            cwd=cwd,
            command=command,
        )
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            env=HOST_ENV,
            cwd="/",  # the worker's cwd would show up as PWD of the sandbox's PID 1
            pass_fds=(env_fd,) if cpu_fd is None else (env_fd, cpu_fd),
            start_new_session=True,
        )
    except BaseException:
        for fd in (out_r, err_r):
            os.close(fd)
        if exec_cgroup is not None:
            exec_cgroup.remove()
        raise
    finally:
        for fd in (env_fd, out_w, err_w, *([] if cpu_fd is None else [cpu_fd])):
            os.close(fd)

    out = _Capture(out_r, "stdout", max_output_bytes, on_output)
    err = _Capture(err_r, "stderr", max_output_bytes, on_output)
    readers = [asyncio.ensure_future(out.run()), asyncio.ensure_future(err.run())]
    try:
        if timeout_sec is not None and timeout_sec > 0:
            await asyncio.wait_for(proc.wait(), timeout_sec)
        else:
            await proc.wait()
    except TimeoutError:
        _kill_exec_now(proc, exec_cgroup)
        await _finish_readers(readers, out, err)
        await _reap_exec(proc, exec_cgroup)
        raise SandboxExecTimeoutError(timeout_sec or 0, out.text(), err.text()) from None
    except BaseException:
        # Cancelled (e.g. Harbor's agent timeout around agent.run): kill synchronously first,
        # so that nothing survives even if the clean-up below is cancelled again.
        _kill_exec_now(proc, exec_cgroup)
        with contextlib.suppress(BaseException):
            await asyncio.shield(_finish_readers(readers, out, err, grace=0))
        with contextlib.suppress(BaseException):
            await asyncio.shield(_reap_exec(proc, exec_cgroup))
        raise
    await _finish_readers(readers, out, err)
    # OOM kills are counted by the sandbox's memory cgroup; the difference over this exec is
    # attributed to it (approximate when execs run concurrently).
    oom_killed = max(0, (oom_kills() or 0) - oom_before)
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
        oom_kills=oom_killed,
    )


def _kill_exec_now(proc: asyncio.subprocess.Process, exec_cgroup: SandboxCgroup | None) -> None:
    if exec_cgroup is not None:
        exec_cgroup.kill_now()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _reap_exec(proc: asyncio.subprocess.Process, exec_cgroup: SandboxCgroup | None) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), 10)
    if exec_cgroup is not None and await exec_cgroup.kill():
        exec_cgroup.remove()


async def read_pipe(fd: int, complete: Callable[[bytes], bool]) -> bytes:
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
    readers: Sequence[asyncio.Future[None]], *captures: _Capture, grace: float = _DRAIN_GRACE_SEC
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
