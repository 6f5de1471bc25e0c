"""Task content as bytes: the canonical archive of a task folder, and safe extraction of
uploaded archives. Pure: no database, no store.

The canonical archive is a plain (uncompressed) POSIX tar whose bytes depend only on
the task's content: entries sorted by path, mtime 0, uid/gid 0, no owner names, and
modes normalised to 0755 (directories, executables) / 0644 (other files). Plain tar
rather than tar.gz because compressed bytes depend on the zlib build, which would
make the same task hash differently on two machines.
"""

from __future__ import annotations

import gzip
import io
import os
import posixpath
import re
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from apps.datasets.errors import TaskFormatError

# Defaults for the size limits; the services read the effective values from settings.
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_TASK_BYTES = 256 * 1024 * 1024
# Entries (files, folders, links) one task may hold; an uploaded archive may hold that many
# per task it carries, up to the archive-wide ceiling.
DEFAULT_MAX_TASK_ENTRIES = 10_000
DEFAULT_MAX_ARCHIVE_MEMBERS = 2_000_000
# A gzip upload whose tar is at most this large is inflated in memory before it is read
# (see _inflated); a larger one is read as it inflates. 10,000 tasks of the examples' shape
# are a 130 MB tar (their headers, a 512-byte block or two per file, are most of it).
DEFAULT_MAX_INFLATED_BYTES = 256 * 1024 * 1024

ARCHIVE_CONTENT_TYPE = "application/x-tar"

# Left out of the archive: they change with every checkout or interpreter run (pyc files
# embed source mtimes) without changing the task, and would otherwise break digest
# stability. Harbor's own packager ignores the same kind of files.
_SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
_SKIP_FILES = frozenset({".DS_Store"})
_SKIP_SUFFIXES = (".pyc", ".pyo")
_NOT_TEXT = re.compile("[\x00\ud800-\udfff]")


@dataclass(frozen=True)
class ArchiveEntry:
    path: str  # posix, relative to the task root
    kind: str  # "dir" | "file" | "symlink"
    mode: int
    data: bytes = b""
    link: str = ""


def _skipped(name: str, is_dir: bool) -> bool:
    if is_dir:
        return name in _SKIP_DIRS
    return name in _SKIP_FILES or name.endswith(_SKIP_SUFFIXES)


def task_entries_collect(
    task_dir: Path,
    *,
    label: str,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_task_bytes: int = DEFAULT_MAX_TASK_BYTES,
    skipped: list[str] | None = None,
) -> list[ArchiveEntry]:
    """Every file, directory and internal symlink of the task, sorted by path.

    Symlinks are kept as links (relative, so they still work after extraction) only when
    they point inside the task; a link that escapes the task, or dangles, is rejected
    because its meaning would depend on the importing machine. The paths of the entries
    left out (caches, VCS folders) are appended to ``skipped`` when it is given.
    """
    root = task_dir.resolve()
    # Paths as strings: the walk visits every entry of every task of a push, and pathlib's
    # relative_to and joins were a fifth of a task's parse. Entries' names are their paths
    # below this prefix, since every path walked is built by joining onto it.
    prefix = os.path.join(str(root), "")
    entries: list[ArchiveEntry] = []
    total = 0
    stack = [str(root)]
    while stack:
        directory = stack.pop()
        with os.scandir(directory) as it:
            children = sorted(it, key=lambda e: e.name)
        if len(entries) + len(children) > DEFAULT_MAX_TASK_ENTRIES:
            raise TaskFormatError(label, f"more than {DEFAULT_MAX_TASK_ENTRIES} entries in one task")
        for child in children:
            rel = child.path[len(prefix) :]
            where = f"{label}/{rel}"
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                raise TaskFormatError(where, "file name is not valid UTF-8") from None
            st = child.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                path = Path(child.path)
                target = os.readlink(path)
                resolved = (path.parent / target).resolve()
                if not resolved.is_relative_to(root):
                    raise TaskFormatError(where, f"symlink points outside the task ({target})")
                if not resolved.exists():
                    raise TaskFormatError(where, f"symlink target does not exist ({target})")
                link = os.path.relpath(resolved, path.parent.resolve())
                entries.append(ArchiveEntry(path=rel, kind="symlink", mode=0o777, link=Path(link).as_posix()))
            elif stat.S_ISDIR(st.st_mode):
                if _skipped(child.name, True):
                    if skipped is not None:
                        skipped.append(rel)
                    continue
                entries.append(ArchiveEntry(path=rel, kind="dir", mode=0o755))
                stack.append(child.path)
            elif stat.S_ISREG(st.st_mode):
                if _skipped(child.name, False):
                    if skipped is not None:
                        skipped.append(rel)
                    continue
                if st.st_size > max_file_bytes:
                    raise TaskFormatError(
                        where, f"file is {st.st_size} bytes, over the limit of {max_file_bytes} bytes"
                    )
                total += st.st_size
                if total > max_task_bytes:
                    raise TaskFormatError(label, f"task content is over the limit of {max_task_bytes} bytes")
                with open(child.path, "rb") as fh:
                    data = fh.read()
                mode = 0o755 if st.st_mode & 0o111 else 0o644
                entries.append(ArchiveEntry(path=rel, kind="file", mode=mode, data=data))
            else:
                raise TaskFormatError(where, "not a regular file, directory or symlink")
    entries.sort(key=lambda e: e.path)
    return entries


_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE
_KINDS = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "file": tarfile.REGTYPE}
_USTAR_SIZE_LIMIT = 8**11  # a size field's 11 octal digits


def canonical_tar(entries: Iterable[ArchiveEntry]) -> bytes:
    """The deterministic tar of `entries` (already sorted): same content -> same bytes.

    The bytes are those of tarfile writing the entries in PAX format (mtime 0, owner 0 and
    unnamed, the entry's mode), which is what every stored task's digest was taken over.
    An entry whose name and link are ASCII and fit their ustar fields, as nearly all do,
    gets the plain ustar header tarfile writes for it, built here (tarfile's header code
    was a quarter of a task's parse); any other gets tarfile's own header (a PAX extended
    header, then ustar)."""
    parts: list[bytes] = []
    size = 0
    for entry in entries:
        kind = _KINDS[entry.kind]
        data = entry.data if kind == tarfile.REGTYPE else b""
        header = _ustar_header(entry, kind=kind, size=len(data)) or _tarfile_header(entry, kind=kind, size=len(data))
        parts.append(header)
        size += len(header)
        if data:
            parts.append(data)
            padding = -len(data) % _BLOCK
            parts.append(bytes(padding))
            size += len(data) + padding
    # The end: two zero blocks, then zeros to a whole record, as TarFile.close writes.
    size += 2 * _BLOCK
    parts.append(bytes(2 * _BLOCK + (-size % _RECORD)))
    return b"".join(parts)


def _ustar_header(entry: ArchiveEntry, *, kind: bytes, size: int) -> bytes | None:
    """tarfile's header for the entry (TarInfo.create_pax_header with nothing for a PAX
    header, then _create_header in ustar format), or None when it would need a PAX header."""
    name = entry.path + "/" if kind == tarfile.DIRTYPE else entry.path
    if not (name.isascii() and entry.link.isascii() and len(name) <= 100 and len(entry.link) <= 100):
        return None
    if size >= _USTAR_SIZE_LIMIT:
        return None
    buf = b"".join(
        (
            name.encode("ascii").ljust(100, b"\0"),
            b"%07o\0" % (entry.mode & 0o7777),
            b"0000000\0" * 2,  # uid, gid
            b"%011o\0" % size,
            b"00000000000\0",  # mtime
            b"        ",  # the checksum field counts as spaces while the sum is taken
            kind,
            entry.link.encode("ascii").ljust(100, b"\0"),
            tarfile.POSIX_MAGIC,
        )
    ).ljust(_BLOCK, b"\0")  # no owner names, device numbers or name prefix
    return buf[:148] + b"%06o\0" % sum(buf) + buf[155:]


def _tarfile_header(entry: ArchiveEntry, *, kind: bytes, size: int) -> bytes:
    """The entry's header as TarFile.addfile writes it in PAX format."""
    info = tarfile.TarInfo(entry.path)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = entry.mode
    info.type = kind
    info.linkname = entry.link
    info.size = size
    return info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")


class DataFilter:
    """Python's "data" extraction filter (tarfile.data_filter), made cheap for the members
    that make up nearly all of an upload: a file or folder with a relative name without
    `..`, neither under nor onto a link extracted before it.

    Into a folder that held no links, such a member's path is inside the folder as written,
    so the two realpath() walks per member the library filter makes (most of an
    extraction's time: a stat per path component) cannot change its answer; the member gets
    the library filter's attributes. Every other member (a link, `..`, an absolute name, a
    special file, a path through or onto a link) goes to tarfile.data_filter itself. Use one
    per extraction, on a fresh folder."""

    def __init__(self) -> None:
        self._links: set[str] = set()  # normalised names of the links extracted so far

    def __call__(self, member: tarfile.TarInfo, dest_path: str) -> tarfile.TarInfo:
        name = member.name
        if (member.isreg() or member.isdir()) and name and not name.startswith("/"):
            parts = posixpath.normpath(name).split("/")
            if ".." not in name.split("/") and not any(
                "/".join(parts[:i]) in self._links for i in range(1, len(parts) + 1)
            ):
                return self._data_attrs(member)
        if member.issym() or member.islnk():
            self._links.add(posixpath.normpath(name.lstrip("/")))
        return tarfile.data_filter(member, dest_path)

    @staticmethod
    def _data_attrs(member: tarfile.TarInfo) -> tarfile.TarInfo:
        """tarfile.data_filter's attributes for a regular file or a folder: no high mode
        bits, no group/other write, a file without the owner's execute bit executable by
        no one and readable and writable by its owner, a folder's mode and every owner
        left to the extracting process.

        Set on the member itself, not on a copy as the library filter makes (a copy per
        member was a tenth of an extraction): the member is the extraction's own, read
        from the archive for this one use, and its filtered attributes are what any later
        use of it (a hard link's target copied) should get anyway."""
        # None, as the library filter sets them (typeshed types these fields without it).
        unset: Any = None
        member.uid = member.gid = member.uname = member.gname = unset
        if member.isdir():
            member.mode = unset
        elif member.mode is not None:
            mode = member.mode & 0o755
            if not mode & 0o100:
                mode &= ~0o111
            member.mode = mode | 0o600
        return member


_Path = str | bytes | os.PathLike[str] | os.PathLike[bytes]


class _UploadTar(tarfile.TarFile):
    """TarFile for reading an upload: it leaves out the two calls per member that change
    nothing here (a tenth of an extraction).

    * chown: the data filter leaves every owner to the extracting process (uid and gid
      None), so TarFile's call would be chown(path, -1, -1).
    * utime: nothing reads the times of the unpacked files (a task's archive and digest
      have mtime 0), so the files keep the times of their writing.

    TarFile's extraction has called these two methods per member since its first version."""

    def chown(self, tarinfo: tarfile.TarInfo, targetpath: _Path, numeric_owner: bool) -> None:
        if tarinfo.uid is not None or tarinfo.gid is not None:
            super().chown(tarinfo, targetpath, numeric_owner)

    def utime(self, tarinfo: tarfile.TarInfo, targetpath: _Path) -> None:
        return None


def _inflated(fileobj: IO[bytes], *, limit: int) -> io.BytesIO | None:
    """The tar inside a seekable gzip upload, inflated in memory, when it is one whole gzip
    member of at most ``limit`` bytes; else None, with ``fileobj`` back where it was.

    The tar is then read from memory, whose reads, seeks and tells are C: through
    GzipFile, tarfile's read, seek and tell per member are Python calls, and they were a
    fifth of an extraction. Whatever is not plainly well-formed (a truncated or corrupt
    stream, several gzip members, bytes after the member, a tar over ``limit``, as a
    small gzip of a huge tar is) is left to GzipFile, which answers as it always has: its
    limits then stop it at the first member that crosses one."""
    start = fileobj.tell()
    out = io.BytesIO()
    inflater = zlib.decompressobj(wbits=31)  # 31: a gzip header and trailer (CRC-32, size)
    try:
        while not inflater.eof and out.tell() <= limit:
            block = fileobj.read(1 << 20)
            if not block:
                break
            # At most one byte over the limit, whatever the block inflates to.
            out.write(inflater.decompress(block, limit + 1 - out.tell()))
        whole = inflater.eof and not inflater.unused_data and out.tell() <= limit and not fileobj.read(1)
    except zlib.error:
        whole = False
    if not whole:
        fileobj.seek(start)
        return None
    out.seek(0)
    return out


@contextmanager
def _tar_opened(fileobj: IO[bytes], *, inflate_limit: int) -> Iterator[tarfile.TarFile]:
    """The upload as a tar read front to back. A gzip (what the CLI sends) is inflated in
    memory when it can be (``_inflated``), else read through GzipFile, whose buffered
    reads are C, by tarfile's seekable reader, which only ever seeks forward here: the
    stream reader's small Python-level reads were a fifth of an extraction's time.
    Anything else (plain, bz2, xz tars) goes to the stream reader."""
    magic = b""
    if fileobj.seekable():
        start = fileobj.tell()
        magic = fileobj.read(2)
        fileobj.seek(start)
    if magic != b"\x1f\x8b":
        with _UploadTar.open(fileobj=fileobj, mode="r|*") as tar:
            yield tar
        return
    inflated = _inflated(fileobj, limit=inflate_limit)
    if inflated is not None:
        with _UploadTar.open(fileobj=inflated, mode="r:") as tar:
            yield tar
        return
    with gzip.GzipFile(fileobj=fileobj, mode="rb") as unzipped, _UploadTar.open(fileobj=unzipped, mode="r:") as tar:
        yield tar


def archive_extract(
    fileobj: IO[bytes],
    dest: Path,
    *,
    max_member_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_total_bytes: int = DEFAULT_MAX_TASK_BYTES,
    max_task_entries: int = DEFAULT_MAX_TASK_ENTRIES,
    max_members: int = DEFAULT_MAX_ARCHIVE_MEMBERS,
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES,
    where: str = "archive",
    on_member: Callable[[tarfile.TarInfo], None] | None = None,
) -> Path:
    """Safely unpack an uploaded tar / tar.gz into `dest` and return the dataset root.

    One pass: each member's header is checked before its bytes are written, so a small
    gzip that would expand enormously stops at the first limit it crosses (the caller's
    temporary folder then goes with what was written); a gzip is inflated in memory first
    only up to ``max_inflated_bytes``, and read as it inflates past that. The entry limit
    is per task: the archive may hold ``max_task_entries`` entries for every task.toml seen
    so far plus one task's worth (a task's files sort before its task.toml), so a dataset
    of many small tasks fits, and ``max_members`` is the ceiling whatever it holds. Python's
    "data" extraction filter (DataFilter: the same answers, cheaper) refuses absolute
    paths, `..`, links leaving `dest` and device files; a hard link must follow its target.
    A single top-level folder is descended into, since `tar czf x.tgz mytasks/` is
    the natural way to pack a folder of tasks. ``on_member`` is called with each member
    once it is on disk (the caller may start reading folders the archive has moved past).
    """
    data_filter = DataFilter()
    try:
        with _tar_opened(fileobj, inflate_limit=max_inflated_bytes) as tar:
            count = tasks = total = 0
            for member in tar:
                _member_names_check(member, where=where)
                count += 1
                if count > max_members:
                    raise TaskFormatError(where, f"more than {max_members} entries")
                if count > max_task_entries * (tasks + 1):
                    raise TaskFormatError(
                        where,
                        f"more than {max_task_entries} entries per task ({count} entries, {tasks} task.toml files)",
                    )
                if member.isfile():
                    if member.size > max_member_bytes:
                        raise TaskFormatError(
                            f"{where}: {member.name}",
                            f"file is {member.size} bytes, over the limit of {max_member_bytes} bytes",
                        )
                    total += member.size
                    if total > max_total_bytes:
                        raise TaskFormatError(where, f"content is over the limit of {max_total_bytes} bytes")
                    if member.name.rsplit("/", 1)[-1] == "task.toml":
                        tasks += 1
                _link_check(member, dest, where=where)
                try:
                    tar.extract(member, dest, filter=data_filter)
                except tarfile.FilterError as exc:
                    raise TaskFormatError(f"{where}: {member.name}", _filter_reason(exc)) from None
                if on_member is not None:
                    on_member(member)
    except tarfile.ReadError as exc:
        raise TaskFormatError(where, f"not a readable tar or tar.gz file ({exc})") from None
    except tarfile.StreamError as exc:
        raise TaskFormatError(where, f"not a readable tar or tar.gz file ({exc})") from None
    except EOFError:
        raise TaskFormatError(where, "truncated archive") from None
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise TaskFormatError(where, f"not a readable tar or tar.gz file ({exc})") from None
    return archive_root(dest)


def _link_check(member: tarfile.TarInfo, dest: Path, *, where: str) -> None:
    """Refuse the links tarfile cannot make where they are: for those it looks for the
    target in the archive instead, reading all the rest of it (past every limit
    archive_extract sets) and seeking back to copy the target's bytes."""

    def inside(name: str) -> bool:  # else the extraction filter refuses the member anyway
        name = posixpath.normpath(name)
        return not (posixpath.isabs(name) or name == ".." or name.startswith("../"))

    if member.islnk() and inside(member.linkname) and not os.path.isfile(os.path.join(dest, member.linkname)):
        raise TaskFormatError(f"{where}: {member.name}", "hard link to a file that is not before it in the archive")
    name = member.name.lstrip("/")
    if member.issym() and inside(name):
        target = os.path.join(dest, posixpath.normpath(name))
        if os.path.isdir(target) and not os.path.islink(target):
            raise TaskFormatError(
                f"{where}: {member.name}", "symlink in the place of a folder before it in the archive"
            )


def _member_names_check(member: tarfile.TarInfo, *, where: str) -> None:
    """A name that is not UTF-8 (tarfile keeps its bytes as lone surrogates) or holds a NUL
    could not be stored, shown or extracted; it is refused, shown with its bytes escaped."""
    for label, name in (("file name", member.name), ("link target", member.linkname)):
        match = _NOT_TEXT.search(name)
        if match:
            problem = "contains a NUL character" if match.group() == "\x00" else "is not valid UTF-8"
            raise TaskFormatError(f"{where}: {_escaped(name)}", f"{label} {problem}")


def _escaped(name: str) -> str:
    """The name's bytes as text, undecodable ones escaped ("caf\\xe9")."""
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that is not an undecodable byte
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace").replace("\x00", "\\x00")


def _filter_reason(exc: tarfile.FilterError) -> str:
    if isinstance(exc, (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError)):
        return "link points outside the archive"
    if isinstance(exc, (tarfile.AbsolutePathError, tarfile.OutsideDestinationError)):
        return "path points outside the archive"
    if isinstance(exc, tarfile.SpecialFileError):
        return "special files (devices, fifos) are not allowed"
    return str(exc)


def archive_root(dest: Path) -> Path:
    """`dest`, or its only child folder when the archive wrapped everything in one."""
    children = [c for c in dest.iterdir() if not c.name.startswith(".")]
    if (
        len(children) == 1
        and children[0].is_dir()
        and not children[0].is_symlink()
        and not (children[0] / "task.toml").exists()
    ):
        return children[0]
    return dest


def archive_unpack(data: bytes, dest: Path) -> Path:
    """Materialise a canonical task archive (e.g. for a sandbox) into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        tar.extractall(dest, filter="data")
    return dest
