"""The build cache on its own (no sandbox): one builder per key, bounded, pruned safely."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
from pathlib import Path

from synth_sandbox.buildcache import BuildCache, _acquire
from tests.sandbox.helpers import run


def key(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


class Recorder:
    """build/restore callables that record what happened."""

    def __init__(self) -> None:
        self.built: list[str] = []
        self.restored: list[str] = []

    def build_for(self, label: str, *, delay: float = 0.0):  # type: ignore[no-untyped-def]
        async def build(target: Path) -> None:
            await asyncio.sleep(delay)
            target.mkdir()
            (target / "result").write_text(label)
            self.built.append(label)

        return build

    async def restore(self, entry: Path) -> None:
        self.restored.append((entry / "result").read_text())


def test_concurrent_fetches_build_once(tmp_path: Path) -> None:
    cache = BuildCache(root=tmp_path / "cache")
    rec = Recorder()

    async def main() -> list[bool]:
        return await asyncio.gather(
            *(
                cache.fetch_or_build(key(1), restore=rec.restore, build=rec.build_for(f"b{i}", delay=0.2))
                for i in range(4)
            )
        )

    hits = run(main())
    assert sorted(hits) == [False, True, True, True]
    assert len(rec.built) == 1 and rec.restored == rec.built * 3


def test_a_failed_build_leaves_nothing_and_the_next_one_builds(tmp_path: Path) -> None:
    cache = BuildCache(root=tmp_path / "cache")
    rec = Recorder()

    async def failing(target: Path) -> None:
        target.mkdir()
        (target / "half").write_text("x")
        raise RuntimeError("RUN failed")

    async def main() -> bool:
        try:
            await cache.fetch_or_build(key(1), restore=rec.restore, build=failing)
        except RuntimeError:
            pass
        return await cache.fetch_or_build(key(1), restore=rec.restore, build=rec.build_for("second"))

    assert run(main()) is False and rec.built == ["second"]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()) == [key(1)]


def test_lock_files_of_failed_builds_are_cleaned(tmp_path: Path) -> None:
    cache = BuildCache(root=tmp_path / "cache")
    rec = Recorder()

    async def failing(target: Path) -> None:
        raise RuntimeError("RUN failed")

    async def main() -> None:
        try:
            await cache.fetch_or_build(key(1), restore=rec.restore, build=failing)
        except RuntimeError:
            pass
        await cache.fetch_or_build(key(2), restore=rec.restore, build=rec.build_for("2"))

    run(main())
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [key(2), f"{key(2)}.lock"]


def test_entries_are_bounded_least_recently_used_first_and_never_in_use(tmp_path: Path) -> None:
    cache = BuildCache(root=tmp_path / "cache", keep=2)
    rec = Recorder()

    async def fetch(n: int) -> bool:
        return await cache.fetch_or_build(key(n), restore=rec.restore, build=rec.build_for(str(n)))

    async def main() -> None:
        await fetch(1)
        await fetch(2)
        os.utime(cache.entry(key(1)), (1, 1))
        os.utime(cache.entry(key(2)), (2, 2))
        assert await fetch(1) is True  # a use makes 1 the most recent
        async with cache.locked(key(2), exclusive=False):  # 2 is being restored elsewhere
            await fetch(3)
            assert cache.has(key(2))  # beyond the bound, but in use: kept for now
        assert cache.prune() == [key(2)]

    run(main())
    assert cache.has(key(1)) and cache.has(key(3)) and not cache.has(key(2))
    assert not (tmp_path / "cache" / f"{key(2)}.lock").exists()


def test_leftovers_of_a_dead_builder_are_removed(tmp_path: Path) -> None:
    cache = BuildCache(root=tmp_path / "cache")
    root = tmp_path / "cache"
    root.mkdir()
    stale = root / f".{key(7)}.tmp-deadbeef"
    (stale / "app").mkdir(parents=True)

    async def main() -> None:
        async with cache.locked(key(7), exclusive=True):  # a live builder's leftovers stay
            cache.prune()
            assert stale.exists()

    run(main())
    cache.prune()
    assert not stale.exists()


def test_a_waiter_on_a_pruned_lock_file_takes_the_new_one(tmp_path: Path) -> None:
    """A waiter that wins the lock of a file the pruner unlinked must not believe it holds the
    key while another process holds the key's new lock file."""
    root = tmp_path / "cache"
    root.mkdir()
    path = root / f"{key(1)}.lock"

    async def main() -> None:
        pruner = os.open(path, os.O_RDWR | os.O_CREAT)
        fcntl.flock(pruner, fcntl.LOCK_EX)
        waiter = asyncio.create_task(_acquire(path, exclusive=True))
        await asyncio.sleep(0.1)  # the waiter has opened the old file and polls it
        os.unlink(path)
        other = await _acquire(path, exclusive=True)  # a newcomer: the new file, uncontended
        os.close(pruner)
        await asyncio.sleep(0.3)  # several polls: the waiter now has the old file's lock
        assert not waiter.done()  # ... and saw it was stale: it waits on the new file
        os.close(other)
        fd = await asyncio.wait_for(waiter, 10)
        assert os.fstat(fd).st_ino == os.stat(path).st_ino
        os.close(fd)

    run(main())
