"""Host-side file transfer into and out of a sandbox directory, without following its symlinks.

The sandbox's writable directories live on the host and the code in the sandbox controls
their contents.  The worker copies files in and out of them *as host root*, so a naive
``shutil.copy2`` would follow a symlink the sandbox planted (``/logs/agent/x -> /etc/shadow``,
or ``/tests -> /etc/cron.d``) and read or write the host's file instead.  Every operation here
therefore walks paths one component at a time with ``openat``-style calls (``dir_fd`` +
``O_NOFOLLOW``), which is immune to symlinks and to the sandbox swapping a directory for a
symlink while the copy runs:

* inbound (upload): symlinks or files in the way of a directory are replaced by a directory,
  a final symlink is replaced by the file; files are created ``O_EXCL`` and chowned to the
  sandbox uid so the sandbox's root can modify them;
* outbound (download): symlinks, devices, FIFOs and sockets are skipped (never followed);
  setuid/setgid bits are dropped in both directions.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MODE_MASK = 0o1777  # never carry setuid/setgid across the boundary
_CHUNK = 1 << 20


class UnsafePathError(OSError):
    """A path inside the sandbox is a symlink or otherwise cannot be used safely."""


@contextlib.contextmanager
def closing_fd(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def open_dir(root: Path, parts: Sequence[str], *, create: bool, owner: tuple[int, int] | None) -> int:
    """Open root/parts... as a directory fd, refusing (or, with create, replacing) symlinks."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise UnsafePathError(f"invalid path component {part!r}")
            if create:
                _ensure_dir_entry(fd, part, owner)
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise UnsafePathError(
                    exc.errno,
                    f"cannot open {part!r} below {root} as a directory (symlink or not a directory): {exc.strerror}",
                ) from exc
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def empty_dir(dir_fd: int) -> None:
    """Remove everything inside the directory dir_fd (subtrees by their fds: a symlink in
    it is removed, never followed)."""
    with os.scandir(dir_fd) as entries:
        names = [e.name for e in entries]
    for name in names:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)


def _ensure_dir_entry(dir_fd: int, name: str, owner: tuple[int, int] | None, mode: int = 0o755) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        return
    if st is not None:
        # A symlink or file where the upload needs a directory: the upload wins.
        os.unlink(name, dir_fd=dir_fd)
    os.mkdir(name, mode, dir_fd=dir_fd)
    if owner is not None:
        os.chown(name, owner[0], owner[1], dir_fd=dir_fd, follow_symlinks=False)


def _copy_fd(src: int, dst: int) -> None:
    while True:
        try:
            n = os.copy_file_range(src, dst, _CHUNK)
        except OSError:
            break  # not supported between these filesystems: fall back to read/write
        if n == 0:
            return
    while chunk := os.read(src, _CHUNK):
        view = memoryview(chunk)
        while view:
            written = os.write(dst, view)
            view = view[written:]


def write_file(dir_fd: int, name: str, source: Path, owner: tuple[int, int] | None) -> None:
    """Create dir_fd/name from the host file source (trusted), replacing whatever is there."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(f"{name!r} is a directory in the sandbox")
        os.unlink(name, dir_fd=dir_fd)
    src_st = os.stat(source)
    with closing_fd(os.open(source, os.O_RDONLY | os.O_CLOEXEC)) as src:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with closing_fd(os.open(name, flags, 0o600, dir_fd=dir_fd)) as dst:
            _copy_fd(src, dst)
            if owner is not None:
                os.fchown(dst, owner[0], owner[1])
            os.fchmod(dst, stat.S_IMODE(src_st.st_mode) & _MODE_MASK)
            os.utime(dst, ns=(src_st.st_atime_ns, src_st.st_mtime_ns))


def copy_tree_in(source: Path, dst_fd: int, owner: tuple[int, int] | None) -> None:
    """Copy the contents of host directory source into the directory dst_fd (merging)."""
    for entry in os.scandir(source):
        if entry.is_symlink():
            # Task files may contain symlinks; recreate them as symlinks.  They are only ever
            # resolved inside the sandbox, because host-side code here never follows one.
            target = os.readlink(entry.path)
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(entry.name, dir_fd=dst_fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    raise IsADirectoryError(f"{entry.name!r} is a directory in the sandbox")
                os.unlink(entry.name, dir_fd=dst_fd)
            os.symlink(target, entry.name, dir_fd=dst_fd)
            if owner is not None:
                os.chown(entry.name, owner[0], owner[1], dir_fd=dst_fd, follow_symlinks=False)
        elif entry.is_dir():
            _ensure_dir_entry(dst_fd, entry.name, owner, mode=stat.S_IMODE(entry.stat().st_mode) & _MODE_MASK)
            with closing_fd(os.open(entry.name, _DIR_FLAGS, dir_fd=dst_fd)) as sub:
                copy_tree_in(Path(entry.path), sub, owner)
        elif entry.is_file():
            write_file(dst_fd, entry.name, Path(entry.path), owner)
        else:
            logger.debug("not uploading special file %s", entry.path)


def read_file(dir_fd: int, name: str, target: Path) -> None:
    """Copy the regular file dir_fd/name to the host path target (never following a symlink)."""
    try:
        # O_NONBLOCK: opening a FIFO the sandbox planted must not hang the worker.
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise UnsafePathError(
            exc.errno, f"cannot open {name!r} in the sandbox as a regular file: {exc.strerror}"
        ) from exc
    with closing_fd(src):
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{name!r} in the sandbox is not a regular file")
        os.set_blocking(src, True)
        target.parent.mkdir(parents=True, exist_ok=True)
        with closing_fd(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)) as dst:
            _copy_fd(src, dst)
            os.fchmod(dst, stat.S_IMODE(st.st_mode) & 0o777)
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


def copy_tree_out(src_fd: int, target: Path, *, excluded: Callable[[str], bool] | None = None, _rel: str = "") -> None:
    """Copy the directory src_fd to the host directory target; skip links and special files,
    and entries (with their subtrees) whose path relative to src_fd ``excluded`` refuses."""
    target.mkdir(parents=True, exist_ok=True)
    with os.scandir(src_fd) as entries:
        names = [
            (e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False), e.is_symlink()) for e in entries
        ]
    for name, is_dir, is_file, is_link in names:
        rel = f"{_rel}{name}"
        if excluded is not None and excluded(rel):
            continue
        if is_link:
            logger.debug("not downloading symlink %s", name)
        elif is_dir:
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=src_fd)
            except OSError:
                continue  # replaced by a symlink in between, or removed: skip
            with closing_fd(sub):
                copy_tree_out(sub, target / name, excluded=excluded, _rel=f"{rel}/")
        elif is_file:
            try:
                read_file(src_fd, name, target / name)
            except (UnsafePathError, FileNotFoundError):
                continue
        else:
            logger.debug("not downloading special file %s", name)


def snapshot_tree(src_fd: int, target: Path) -> None:
    """Copy the directory src_fd to the new host directory target as it is: directories
    (with their modes), regular files and symlinks (recreated, never followed); special files
    are skipped.  For the build cache, whose entries are copied back with copy_tree_in."""
    target.mkdir(mode=0o700)
    with os.scandir(src_fd) as entries:
        names = [e.name for e in entries]
    for name in names:
        try:
            st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=src_fd), target / name)
        elif stat.S_ISDIR(st.st_mode):
            with closing_fd(os.open(name, _DIR_FLAGS, dir_fd=src_fd)) as sub:
                snapshot_tree(sub, target / name)
            os.chmod(target / name, stat.S_IMODE(st.st_mode) & _MODE_MASK)
        elif stat.S_ISREG(st.st_mode):
            read_file(src_fd, name, target / name)
            os.chmod(target / name, stat.S_IMODE(st.st_mode) & _MODE_MASK)
        else:
            logger.debug("not keeping special file %s", name)
