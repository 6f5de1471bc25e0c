"""The build cache: a Dockerfile with ``RUN`` steps is built once per worker host.

An entry is the content of a sandbox's writable directories right after its build, stored
under the build's key (build.py: the interpreted Dockerfile, its context's content, the
sandbox layout, the host system).  The next sandbox of the same build copies the entry in
instead of running the steps again.

Several trials of one task often start at once, in several worker processes: a lock file per
key (``flock``) makes exactly one of them build while the others wait and then copy its
result; readers share the lock, the builder and the pruner hold it alone.  A lock file is only
ever unlinked by its exclusive holder, and a waiter that wins a lock checks that the file is
still the one at that path (otherwise it starts over), so a pruned key can never be held twice.
Entries are written to a temporary name and renamed into place, so a crashed builder leaves
no half entry.  At most ``keep`` entries are kept (least recently used go first, never one in
use); temporary leftovers of dead builders, and lock files of failed builds, are removed by
the same pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
import secrets
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_KEEP = 8
_KEY = re.compile(r"^[0-9a-f]{64}$")
_POLL_SEC = 0.05


class BuildCache:
    def __init__(self, *, root: Path, keep: int = DEFAULT_KEEP) -> None:
        self.root = Path(root)
        self.keep = max(1, int(keep))

    def entry(self, key: str) -> Path:
        if not _KEY.match(key):
            raise ValueError(f"invalid build cache key {key!r}")
        return self.root / key

    def has(self, key: str) -> bool:
        return self.entry(key).is_dir()

    def _lock_path(self, key: str) -> Path:
        return self.root / f"{key}.lock"

    @contextlib.asynccontextmanager
    async def locked(self, key: str, *, exclusive: bool) -> AsyncIterator[None]:
        """Hold the key's lock (shared or exclusive); waiting is cancellable."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = await _acquire(self._lock_path(key), exclusive=exclusive)
        try:
            yield
        finally:
            os.close(fd)

    async def fetch_or_build(
        self,
        key: str,
        *,
        restore: Callable[[Path], Awaitable[None]],
        build: Callable[[Path], Awaitable[None]],
    ) -> bool:
        """Restore the entry of key if there is one (True), else build it (False).

        ``build(tmp)`` applies the build and exports its result to the new directory tmp.
        """
        async with self.locked(key, exclusive=False):
            if self.has(key):
                await self._restore(key, restore)
                return True
        async with self.locked(key, exclusive=True):
            if self.has(key):  # built by another worker while this one waited
                await self._restore(key, restore)
                return True
            tmp = self.root / f".{key}.tmp-{secrets.token_hex(4)}"
            try:
                await build(tmp)
                os.rename(tmp, self.entry(key))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        await asyncio.to_thread(self.prune)
        return False

    async def _restore(self, key: str, restore: Callable[[Path], Awaitable[None]]) -> None:
        entry = self.entry(key)
        os.utime(entry)  # most recently used
        await restore(entry)

    def prune(self) -> list[str]:
        """Remove entries beyond ``keep`` (least recently used first) and leftovers of builders
        that died, skipping whatever is in use. Returns the keys removed."""
        if not self.root.is_dir():
            return []
        entries = sorted(
            (p for p in self.root.iterdir() if _KEY.match(p.name) and p.is_dir()),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        removed = [p.name for p in entries[self.keep :] if self._remove_if_idle(p.name, entry=True)]
        # Leftovers of builders that died, and lock files of builds that failed.
        orphans = {tmp.name[1:].split(".tmp-", 1)[0] for tmp in self.root.glob(".*.tmp-*")}
        orphans |= {lock.name.removesuffix(".lock") for lock in self.root.glob("*.lock")}
        for key in sorted(orphans):
            if _KEY.match(key) and not self.has(key):
                self._remove_if_idle(key, entry=False)
        return removed

    def _remove_if_idle(self, key: str, *, entry: bool) -> bool:
        path = self._lock_path(key)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # in use: next time
            if entry:
                shutil.rmtree(self.entry(key), ignore_errors=True)
            for tmp in self.root.glob(f".{key}.tmp-*"):
                shutil.rmtree(tmp, ignore_errors=True)
            if not self.has(key):
                path.unlink(missing_ok=True)
            return True
        finally:
            os.close(fd)


async def _acquire(path: Path, *, exclusive: bool) -> int:
    mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, mode)
                    break
                except BlockingIOError:
                    await asyncio.sleep(_POLL_SEC)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # pruned while waiting: take the new lock file
