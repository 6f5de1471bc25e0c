"""Directories as content-addressed packages: pack a directory into one object, and unpack
an object into a local cache directory named by its digest.

Used for model weights (a LoRA adapter, a trainer state): the trainer packs what it saved,
the proxy and a resuming trainer unpack it. The tar is deterministic (sorted names, fixed
owner, mode and time), so the same files always give the same sha256.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

from apps.objects.contract import ObjectCorrupt
from apps.objects.store import store_get

SNAPSHOT_SCHEME = "object:sha256:"
_COMPLETE = ".complete"


def dir_pack(*, path: Path) -> bytes:
    """A deterministic tar of the regular files under ``path`` (no links, no empty dirs)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for file in sorted(p for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink()):
            info = tarfile.TarInfo(file.relative_to(path).as_posix())
            info.size = file.stat().st_size
            info.mode = 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with file.open("rb") as fh:
                tar.addfile(info, fh)
    return buf.getvalue()


def snapshot_ref(sha256: str) -> str:
    return f"{SNAPSHOT_SCHEME}{sha256}"


def snapshot_sha256(snapshot: str) -> str | None:
    """The digest in an ``object:sha256:<hex>`` snapshot reference, else None."""
    if not snapshot.startswith(SNAPSHOT_SCHEME):
        return None
    digest = snapshot[len(SNAPSHOT_SCHEME) :]
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"malformed snapshot reference {snapshot!r}")
    return digest


def package_materialize(
    *, sha256: str, cache_dir: Path, keep: int | None = None, prune_idle_seconds: float = 600.0
) -> Path:
    """The directory holding the package ``sha256``, unpacked once into ``cache_dir/<sha256>``.

    The bytes are checked against the digest before anything is written; the unpacked tree
    appears atomically (a rename), so concurrent callers and crashes never see half of it.
    With ``keep``, the cache is then pruned to the ``keep`` most recently used packages
    (see ``cache_prune``; ``prune_idle_seconds`` is its ``idle_seconds``).
    """
    target = Path(cache_dir) / sha256
    if (target / _COMPLETE).is_file():
        os.utime(target / _COMPLETE)  # most recently used
        return target
    with store_get().open(sha256=sha256) as stream:
        data = stream.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ObjectCorrupt(f"sha256/{sha256} does not match its digest in the object store")
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{sha256[:12]}-", dir=cache_dir))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            tar.extractall(staging, filter="data")  # refuses absolute paths, .., links out
        (staging / _COMPLETE).write_text("")
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / _COMPLETE).is_file():  # not another caller's finished copy
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    if keep is not None:
        cache_prune(cache_dir=Path(cache_dir), keep=keep, idle_seconds=prune_idle_seconds)
    return target


def cache_prune(*, cache_dir: Path, keep: int, idle_seconds: float = 600.0) -> list[str]:
    """Remove unpacked packages beyond the ``keep`` most recently used, among those idle for
    ``idle_seconds`` (a loader that just found one has long finished reading it by then;
    loaded weights live in memory, not in these files). Returns the digests removed."""
    entries = []
    for entry in Path(cache_dir).iterdir():
        marker = entry / _COMPLETE
        if entry.is_dir() and marker.is_file():
            entries.append((marker.stat().st_mtime, entry))
    entries.sort(reverse=True)
    removed = []
    now = time.time()
    for used_at, entry in entries[keep:]:
        if now - used_at >= idle_seconds:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed
