"""File transfer into and out of a sandbox's writable directories.

Host-side copies that walk paths with ``openat`` + ``O_NOFOLLOW`` (hostfs.py): a symlink the
sandbox planted is never followed on the host.  Paths outside the writable directories are
rejected with SandboxPathError.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import re
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from synth_sandbox import hostfs
from synth_sandbox.errors import SandboxPathError
from synth_sandbox.paths import normalize_container_path


def tar_excluded(*, patterns: Sequence[str]) -> Callable[[str], bool]:
    """Whether a path relative to a copied directory is excluded by ``patterns`` as GNU tar's
    ``--exclude`` excludes it from ``tar -C dir .`` (Harbor's tar-based download): by
    default not anchored and with wildcards that match "/", so a pattern excludes a member
    ("./a/b") when it matches the whole name or any tail that starts after a "/" ("a/b",
    "b"); a directory it excludes goes with everything under it."""
    compiled = [re.compile(fnmatch.translate(p)) for p in patterns if p]

    def excluded(rel: str) -> bool:
        name = f"./{rel}"
        tails = [name] + [name[i + 1 :] for i, c in enumerate(name) if c == "/"]
        return any(pattern.match(tail) for pattern in compiled for tail in tails)

    return excluded


class SandboxFiles:
    """The writable directories of a sandbox, backed by the host directory fs."""

    def __init__(self, *, fs: Path, writable_dirs: Sequence[str], owner: tuple[int, int] | None) -> None:
        self.fs = fs
        self.writable_dirs = list(writable_dirs)
        self._owner = owner  # (uid, gid) given to what is copied in; None: the worker's own

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

    async def empty_dir(self, target: str, *, mode: int | None = None) -> None:
        """``mkdir -p`` of a directory inside a writable directory (a symlink or file in the
        way replaced), then everything inside it removed (never through a symlink); with
        ``mode``, its mode set."""
        root, parts = self._locate(target)

        def run() -> None:
            with hostfs.closing_fd(hostfs.open_dir(root, parts, create=True, owner=self._owner)) as fd:
                hostfs.empty_dir(fd)
                if mode is not None:
                    os.fchmod(fd, mode)

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

    async def is_file(self, target: str) -> bool:
        """Whether a path inside a writable directory is a regular file (never through a symlink)."""
        root, parts, name = self._split_parent(target)

        def run() -> bool:
            try:
                with hostfs.closing_fd(hostfs.open_dir(root, parts, create=False, owner=None)) as dir_fd:
                    return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            except OSError:
                return False

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

    async def download_dir(self, source: str, target: Path | str, *, exclude: Sequence[str] = ()) -> None:
        """Copy a directory out, without the entries ``exclude`` names (tar_excluded)."""
        root, parts = self._locate(source)
        excluded = tar_excluded(patterns=exclude) if exclude else None

        def run() -> None:
            try:
                dir_fd = hostfs.open_dir(root, parts, create=False, owner=None)
            except hostfs.UnsafePathError as exc:
                raise FileNotFoundError(f"{source} is not a directory in the sandbox") from exc
            with hostfs.closing_fd(dir_fd):
                hostfs.copy_tree_out(dir_fd, Path(target), excluded=excluded)

        await asyncio.to_thread(run)
