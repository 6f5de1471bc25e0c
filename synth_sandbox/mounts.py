"""A sandbox's directories on the host and the bubblewrap arguments that mount them inside.

``Sandbox.start()`` creates ``<base_dir>/<name>/`` on the host::

    <name>/            0711 root      (meta.json: owner pid, cgroups, mounts; for reap_stale_sandboxes)
      init.log                        bubblewrap's own stderr
      sock/model.sock                 per-sandbox Unix socket served by the model bridge
      hooks/ observed/                phase hooks (read-only inside) and what they observe
      fs/              tmpfs of storage_mb (or a plain directory), owned by the sandbox uid
        app/ logs/{agent,verifier,artifacts}/ tests/ solution/ tmp/ var/tmp/ root/ installed-agent/ runtime/

Inside, the root is an empty tmpfs made read-only after setup, with an allow-list of the
host's system directories (``/usr``, ``/etc``, ``/opt``, ...) bound read-only, a fresh
``/proc`` (own PID namespace), a minimal ``/dev``, a small ``/run``, and each writable
directory of ``fs/`` bound at its Harbor path (``/app``, ``/logs``, ``/tests``, ``/solution``,
``/tmp``, ...).  The host's ``/root``, ``/home``, ``/work``, ``/var``, ``/run`` (database
sockets!), ``/tmp`` and ``/sys`` are simply absent.
"""

from __future__ import annotations

import ctypes
import os
import posixpath
from collections.abc import Sequence
from pathlib import Path

from synth_sandbox.dns import RESOLV_CONF
from synth_sandbox.errors import SandboxError
from synth_sandbox.hooks import HOOKS_IN_SANDBOX, OBSERVED_IN_SANDBOX, hooks_make
from synth_sandbox.paths import MODEL_SOCKET_IN_SANDBOX, PRECREATED_DIRS, SANDBOX_PATH, STICKY_DIRS

_libc = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID = 2
_MS_NODEV = 4
_MNT_DETACH = 2


def mount_tmpfs(target: Path, size_mb: int, uid: int, gid: int) -> None:
    opts = f"size={int(size_mb)}m,mode=0755,uid={uid},gid={gid}".encode()
    if _libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {target}: {os.strerror(err)}")


def umount(target: Path) -> None:
    # MNT_DETACH: never fails because of a process still holding a file (it will be gone soon).
    if _libc.umount2(str(target).encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {target}: {os.strerror(err)}")


def _resolv_conf_target() -> str:
    """Where the sandbox's resolv.conf must be bound: /etc/resolv.conf, or what it links to
    when the host's is a symlink into /run (which is the sandbox's own tmpfs)."""
    path = "/etc/resolv.conf"
    if os.path.islink(path):
        target = os.path.realpath(path)
        if target.startswith("/run/"):
            return target
    return path


def sandbox_dir_make(*, base_dir: Path, sandbox_dir: Path, is_root: bool) -> None:
    """Create the sandbox's host directory and its empty ``fs/`` (where the storage goes)."""
    if not base_dir.exists():
        base_dir.mkdir(parents=True, mode=0o711)
        os.chmod(base_dir, 0o711)
    if is_root:
        # bubblewrap runs as the sandbox uid and must reach the bind sources.
        for parent in [base_dir, *base_dir.parents]:
            if not os.stat(parent).st_mode & 0o001:
                raise SandboxError(
                    f"{parent} is not searchable by other users (mode o+x); the sandbox uid must reach "
                    f"{base_dir}: choose another base_dir or chmod o+x {parent}"
                )
    sandbox_dir.mkdir(mode=0o711)
    os.chmod(sandbox_dir, 0o711)
    (sandbox_dir / "fs").mkdir(mode=0o755)


def sandbox_tree_make(
    *, sandbox_dir: Path, writable_dirs: Sequence[str], owner: tuple[int, int] | None, resolv_conf: bool
) -> None:
    """Fill ``fs/`` (its storage in place) with the writable directories, and add the other
    bind sources: the phase hooks and, for the lookup stub, a resolv.conf."""
    fs = sandbox_dir / "fs"
    if owner is not None:
        os.chown(fs, *owner)
    for d in [*writable_dirs, *PRECREATED_DIRS]:
        target = fs / d.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        if owner is not None:
            p = target
            while p != fs:
                os.chown(p, *owner)
                p = p.parent
    for d in STICKY_DIRS:
        os.chmod(fs / d.lstrip("/"), 0o1777)
    os.chmod(fs / "root", 0o700)
    hooks_make(sandbox_dir=sandbox_dir, owner=owner)
    if resolv_conf:
        (sandbox_dir / "resolv.conf").write_text(RESOLV_CONF)
        os.chmod(sandbox_dir / "resolv.conf", 0o644)


def bwrap_args(
    *,
    sandbox_dir: Path,
    info_fd: int,
    hostname: str,
    is_root: bool,
    host_dirs: Sequence[str],
    extra_ro_binds: Sequence[str],
    writable_dirs: Sequence[str],
    model_socket: bool,
    resolv_conf: bool,
) -> list[str]:
    """bubblewrap's options for the sandbox's init (what ``bwrap`` gets before ``--``)."""
    fs = sandbox_dir / "fs"
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
        hostname,
        "--info-fd",
        str(info_fd),
        "--clearenv",
        "--setenv",
        "PATH",
        SANDBOX_PATH,
    ]
    if is_root:
        # No nested user namespaces inside (less kernel surface).  bubblewrap implements this
        # with a second, nested user namespace that owns nothing; entering the sandbox then
        # needs capabilities in the outer one, which only host root has (nsenter from a
        # non-root worker would fail), hence root only.
        args.append("--disable-userns")
    for d in host_dirs:
        host = Path("/") / d
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{d}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{d}"]
    for spec in extra_ro_binds:
        src, _, dst = spec.partition(":")
        args += ["--ro-bind", src, dst or src]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "0755", "--size", str(16 << 20), "--tmpfs", "/run"]
    made: set[str] = set()
    for d in writable_dirs:
        # Parents that bubblewrap would otherwise create with mode 0700 (e.g. /var for /var/tmp).
        parent = posixpath.dirname(d)
        chain: list[str] = []
        while parent != "/" and parent not in made:
            chain.append(parent)
            parent = posixpath.dirname(parent)
        for p in reversed(chain):
            args += ["--perms", "0755", "--dir", p]
            made.add(p)
        args += ["--bind", str(fs / d.lstrip("/")), d]
    if model_socket:
        args += ["--ro-bind", str(sandbox_dir / "sock" / "model.sock"), MODEL_SOCKET_IN_SANDBOX]
    args += ["--ro-bind", str(sandbox_dir / "hooks"), HOOKS_IN_SANDBOX]
    args += ["--bind", str(sandbox_dir / "observed"), OBSERVED_IN_SANDBOX]
    if resolv_conf:
        args += ["--ro-bind", str(sandbox_dir / "resolv.conf"), _resolv_conf_target()]
    # The root itself is a bubblewrap tmpfs: make it read-only so that only the writable
    # directories (all size-limited together) can be written.
    args += ["--remount-ro", "/", "--chdir", "/"]
    return args
