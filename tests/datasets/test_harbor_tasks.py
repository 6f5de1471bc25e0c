"""Parsing and canonical archives of Harbor task folders (pure: no database)."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from apps.datasets import harbor_tasks, task_archives
from apps.datasets.errors import TaskFormatError
from apps.datasets.harbor_tasks import task_dir_parse
from tests.datasets.conftest import EXAMPLE_SLUGS, EXAMPLE_TASKS, EXAMPLES, TASK_TOML, write_task


def test_there_are_at_least_six_examples() -> None:
    assert len(EXAMPLE_SLUGS) >= 6


@pytest.mark.parametrize("slug", EXAMPLE_SLUGS)
def test_each_example_task_parses(slug: str) -> None:
    parsed = task_dir_parse(EXAMPLE_TASKS / slug)
    config = parsed.config
    assert parsed.name == f"synth-examples/{slug}"
    assert config.schema_version == "1.4"
    assert config.environment.workdir == "/app"
    assert config.agent.timeout_sec and config.verifier.timeout_sec
    assert config.environment.cpus and config.environment.memory_mb and config.environment.storage_mb
    assert parsed.has_dockerfile and parsed.has_solution
    assert parsed.instruction.strip()
    assert "tests/test.sh" in parsed.files and "solution/solve.sh" in parsed.files
    assert parsed.config_json["task"]["name"] == parsed.name


def test_examples_cover_the_requested_features() -> None:
    parsed = {slug: task_dir_parse(EXAMPLE_TASKS / slug) for slug in EXAMPLE_SLUGS}
    assert any(p.config.environment.network_mode.value == "no-network" for p in parsed.values())
    assert any(p.memory_mb == 3072 for p in parsed.values())
    assert any("reward.json" in (EXAMPLE_TASKS / s / "tests" / "test.sh").read_text() for s in parsed)


def _members(archive: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        return tar.getmembers()


def test_archive_is_canonical(examples_copy) -> None:
    first, second = examples_copy(1), examples_copy(2)
    for slug in EXAMPLE_SLUGS:
        a, b = task_dir_parse(first / slug), task_dir_parse(second / slug)
        assert a.digest == b.digest, slug
        assert a.archive == b.archive
    members = _members(task_dir_parse(first / "fix-failing-test").archive)
    names = [m.name for m in members]
    assert names == sorted(names)
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" and m.gname == "" for m in members)
    modes = {m.name: m.mode for m in members}
    assert modes["tests/test.sh"] == 0o755
    assert modes["solution/solve.sh"] == 0o755
    assert modes["task.toml"] == 0o644
    assert modes["environment/app"] == 0o755 and members[names.index("environment/app")].isdir()


def test_digest_follows_content_and_executable_bit(tmp_path: Path) -> None:
    task = write_task(tmp_path, "hello")
    base = task_dir_parse(task).digest
    (task / "solution" / "solve.sh").chmod(0o644)
    no_exec = task_dir_parse(task).digest
    assert no_exec != base
    (task / "solution" / "solve.sh").chmod(0o700)  # any executable bit is 0755
    assert task_dir_parse(task).digest == base
    (task / "instruction.md").write_text("something else\n")
    assert task_dir_parse(task).digest != base


def _tarfile_canonical_tar(entries: list[task_archives.ArchiveEntry]) -> bytes:
    """The canonical archive as TarFile writes it: what every stored digest was taken over."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.path)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = entry.mode
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, entry.link
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return buf.getvalue()


# Digests of the example tasks as TarFile wrote their archives (stored datasets hold them).
EXAMPLE_DIGESTS = {
    "count-primes-memory": "d6c43d4d696a889d01b7b7a7d0efe42f28261d7487c763d17e22ce2336847e87",
    "fix-failing-test": "b16dd1878223dfb2259eab46db7b0cf4021419f76a20ac632bd57423464a17d2",
    "implement-roman": "00832fd7df3b28d8c3534625576e902a98ada412020ffea354ed6b8a15cf6cbf",
    "offline-checksums": "12ae611ea091a3f292bebf3a1fd913508c0cca0446eb9a6e9ef9abda11820b8b",
    "slugify-graded": "f4f4a3513dd85ab65d86a4bee97e20cddaad2764c7d1a95bb33c961b63a1e2f5",
    "word-frequencies": "ba47df669b26092fb117038fbbf07aebed39f2f5214b303a7d31b64cdbcdbc88",
}


def test_canonical_archives_are_the_bytes_tarfile_writes() -> None:
    """canonical_tar builds ustar headers itself: every entry, plain or needing a PAX
    header (a long or non-ASCII name or link), gives the bytes TarFile gives."""
    assert {slug: task_dir_parse(EXAMPLE_TASKS / slug).digest for slug in EXAMPLE_SLUGS} == EXAMPLE_DIGESTS
    for slug in EXAMPLE_SLUGS:
        entries = task_archives.task_entries_collect(EXAMPLE_TASKS / slug, label=slug)
        assert task_archives.canonical_tar(entries) == _tarfile_canonical_tar(entries)
    entry = task_archives.ArchiveEntry
    long = "d/" + "n" * 98  # 100 characters: the longest name a ustar field holds
    sized = [
        [entry(path="a", kind="file", mode=0o755, data=b"x" * size), entry(path="b", kind="dir", mode=0o755)]
        for size in (1, 511, 512, 513, 10240, 10241)
    ]
    cases = sized + [
        [],
        [entry(path="a", kind="file", mode=0o644, data=b"")],
        [entry(path=long, kind="file", mode=0o644, data=b"at the limit")],
        [entry(path=long + "x", kind="file", mode=0o644, data=b"over it")],
        [entry(path="d/" + "n" * 97, kind="dir", mode=0o755)],  # 99, and its "/" makes 100
        [entry(path="d/" + "n" * 98, kind="dir", mode=0o755)],  # its "/" makes 101
        [entry(path="caf\u00e9.txt", kind="file", mode=0o644, data=b"non-ASCII name")],
        [entry(path="odd\udce9.txt", kind="file", mode=0o644, data=b"undecodable name")],
        [entry(path="l", kind="symlink", mode=0o777, link="t/" + "x" * 98)],
        [entry(path="l", kind="symlink", mode=0o777, link="t/" + "x" * 99)],
        [entry(path="l", kind="symlink", mode=0o777, link="\u00e9t\u00e9")],
        [entry(path=f"f{i:03d}", kind="file", mode=0o644, data=bytes([i]) * i) for i in range(40)],
    ]
    for entries in cases:
        assert task_archives.canonical_tar(entries) == _tarfile_canonical_tar(entries), entries[:1]


def test_caches_are_left_out_of_the_archive(tmp_path: Path) -> None:
    task = write_task(tmp_path, "hello")
    base = task_dir_parse(task).digest
    (task / "tests" / "__pycache__").mkdir()
    (task / "tests" / "__pycache__" / "x.cpython-312.pyc").write_bytes(b"\0")
    (task / ".DS_Store").write_bytes(b"\0")
    assert task_dir_parse(task).digest == base


def _error(task: Path, **kwargs: object) -> str:
    with pytest.raises(TaskFormatError) as info:
        task_dir_parse(task, **kwargs)  # type: ignore[arg-type]
    return str(info.value)


def test_missing_test_script_is_named(tmp_path: Path) -> None:
    task = write_task(tmp_path, "hello")
    (task / "tests" / "test.sh").unlink()
    assert _error(task) == "hello/tests/test.sh: missing"


def test_missing_instruction_is_named(tmp_path: Path) -> None:
    task = write_task(tmp_path, "hello")
    (task / "instruction.md").unlink()
    assert _error(task) == "hello/instruction.md: missing"


def test_missing_task_toml_and_environment(tmp_path: Path) -> None:
    task = write_task(tmp_path, "hello")
    (task / "environment" / "Dockerfile").unlink()
    (task / "environment").rmdir()
    assert _error(task).startswith("hello/environment/: missing")
    (task / "task.toml").unlink()
    assert _error(task) == "hello/task.toml: missing"


def test_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    task = write_task(tmp_path, "hello", toml='schema_version = "1.4"\n[task]\nname = test/hello\n')
    message = _error(task)
    assert message.startswith("hello/task.toml: line 3, column 8: invalid TOML")


def test_wrong_type_names_the_line_and_key(tmp_path: Path) -> None:
    toml = TASK_TOML.format(slug="hello").replace("cpus = 1", 'cpus = "many"')
    line = toml.splitlines().index('cpus = "many"') + 1
    task = write_task(tmp_path, "hello", toml=toml)
    assert _error(task) == f"hello/task.toml: line {line}: [environment].cpus: expected int or float (got 'many')"


def test_invalid_task_name_is_reported(tmp_path: Path) -> None:
    task = write_task(tmp_path, "hello", toml='[task]\nname = "no slash"\n')
    message = _error(task)
    assert message.startswith("hello/task.toml: line 2: [task].name: Package name must be in 'org/name' format")


def test_symlink_outside_the_task_is_rejected(tmp_path: Path) -> None:
    task = write_task(tmp_path, "hello")
    (tmp_path / "secret").write_text("x")
    os.symlink("../../secret", task / "environment" / "leak")
    assert _error(task) == "hello/environment/leak: symlink points outside the task (../../secret)"


def test_symlink_inside_the_task_is_kept_as_a_relative_link(tmp_path: Path) -> None:
    task = write_task(tmp_path, "hello")
    os.symlink(task / "instruction.md", task / "environment" / "instruction-copy.md")  # absolute target
    members = {m.name: m for m in _members(task_dir_parse(task).archive)}
    link = members["environment/instruction-copy.md"]
    assert link.issym() and link.linkname == "../instruction.md"


def test_huge_file_is_rejected(tmp_path: Path) -> None:
    task = write_task(tmp_path, "hello")
    (task / "environment" / "blob.bin").write_bytes(b"x" * 2048)
    assert _error(task, max_file_bytes=1024) == (
        "hello/environment/blob.bin: file is 2048 bytes, over the limit of 1024 bytes"
    )


def test_registry_git_url_is_rejected(tmp_path: Path) -> None:
    data = b'[{"name": "r", "version": "1", "description": "", "tasks": [{"name": "t", "path": "t", "git_url": "https://example.com/x.git"}]}]'
    specs = harbor_tasks.registry_parse(data)
    with pytest.raises(TaskFormatError, match="git_url https://example.com/x.git is not supported"):
        harbor_tasks.registry_tasks_resolve(specs, name="r", version="1", base_dir=tmp_path)


def test_registry_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match=r"^registry.json: line 1, column 2: invalid JSON"):
        harbor_tasks.registry_parse(b"[,]")
    with pytest.raises(TaskFormatError, match=r"^registry.json: \[0\].tasks: required but missing"):
        harbor_tasks.registry_parse(b'[{"name": "r", "version": "1", "description": ""}]')
    specs = harbor_tasks.registry_parse((EXAMPLES / "registry.json").read_bytes() * 1 + b"")
    two = specs + specs
    with pytest.raises(TaskFormatError, match=r"no dataset other@9 \(available: examples@1.0, examples@1.0\)"):
        harbor_tasks.registry_tasks_resolve(two, name="other", version="9", base_dir=EXAMPLES)
    with pytest.raises(TaskFormatError, match="points outside the uploaded archive"):
        harbor_tasks.registry_tasks_resolve(
            specs, name="examples", version="1.0", base_dir=EXAMPLES, confine_to=tmp_path
        )


def test_archive_extract_refuses_path_traversal(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../evil.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    buf.seek(0)
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(TaskFormatError, match=r"archive: ../evil.txt: path points outside the archive"):
        task_archives.archive_extract(buf, dest)
    assert not (tmp_path / "evil.txt").exists()


def _member(name: str, kind: bytes = tarfile.REGTYPE, *, mode: int = 0o644, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    info.uid, info.gid, info.uname, info.gname = 1000, 1000, "someone", "staff"
    info.size = 3 if kind == tarfile.REGTYPE else 0
    return info


# Members of every kind the fast path takes or hands on: modes with high bits, group and
# other write and no owner execute; folders; "./" and "//" names; links inside, and members
# through and onto them; "..", absolute names and links, hard links, a fifo, a device.
FILTER_CASES = [
    _member("./"),
    _member("top", tarfile.DIRTYPE, mode=0o777),
    _member("top/plain.txt"),
    _member("top/setuid", mode=0o4777),
    _member("top/group-exec", mode=0o674),
    _member("top/exec.sh", mode=0o700),
    _member("./top//dotted.txt", mode=0o666),
    _member("top/sub", tarfile.DIRTYPE, mode=0o700),
    _member("top/inner", tarfile.SYMTYPE, link="sub"),
    _member("top/inner/through.txt"),
    _member("top/inner", mode=0o644),
    _member("top/up", tarfile.SYMTYPE, link=".."),
    _member("top/up/sideways.txt"),
    _member("top/out", tarfile.SYMTYPE, link="../.."),
    _member("top/abs", tarfile.SYMTYPE, link="/etc"),
    _member("top/hard", tarfile.LNKTYPE, link="top/plain.txt"),
    _member("top/../back.txt"),
    _member("../escape.txt"),
    _member("/etc/absolute.txt"),
    _member("top/fifo", tarfile.FIFOTYPE),
    _member("top/dev", tarfile.CHRTYPE),
]


def _extracted(dest: Path, choose) -> tuple[list[tuple[str, str]], list[tuple]]:
    """Extract FILTER_CASES one by one with the filter ``choose()`` gives: (each member's
    outcome, the tree left behind)."""
    dest.mkdir()
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for info in FILTER_CASES:
            tar.addfile(info, io.BytesIO(b"abc") if info.isreg() else None)
    data.seek(0)
    outcomes = []
    with tarfile.open(fileobj=data, mode="r") as tar:
        the_filter = choose()
        for member in tar.getmembers():
            try:
                tar.extract(member, dest, filter=the_filter)
                outcomes.append((member.name, "ok"))
            except (tarfile.FilterError, OSError) as exc:
                outcomes.append((member.name, type(exc).__name__))
    tree = []
    for path in sorted(dest.rglob("*")):
        st = path.lstat()
        link = os.readlink(path) if path.is_symlink() else ""
        body = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        tree.append((str(path.relative_to(dest)), st.st_mode, st.st_uid, st.st_gid, link, body))
    return outcomes, tree


def test_the_fast_data_filter_gives_the_library_filters_answers(tmp_path: Path) -> None:
    library = _extracted(tmp_path / "library", lambda: "data")
    fast = _extracted(tmp_path / "fast", task_archives.DataFilter)
    assert fast == library
    outcomes = dict(library[0])
    # The cases cover both paths and every refusal the filter makes.
    assert outcomes["top/setuid"] == outcomes["top/inner/through.txt"] == outcomes["top/up/sideways.txt"] == "ok"
    for refused in ("top/out", "top/abs", "../escape.txt", "top/fifo", "top/dev"):
        assert outcomes[refused].endswith("Error"), refused
    assert (tmp_path / "fast" / "sideways.txt").is_file()  # through a link to the top: still inside
    assert (tmp_path / "fast" / "etc" / "absolute.txt").is_file()  # its leading "/" dropped
    assert not (tmp_path / "escape.txt").exists()


def test_archive_extract_refuses_garbage(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match="not a readable tar or tar.gz file"):
        task_archives.archive_extract(io.BytesIO(b"not a tar at all" * 100), tmp_path)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[: len(data) // 2], "archive: truncated archive"),
        (lambda data: data[:10] + bytes(b ^ 0x5A for b in data[10:]), "archive: not a readable tar or tar.gz file"),
        (lambda data: data[:2] + b"\x07" + data[3:], "archive: not a readable tar or tar.gz file"),
    ],
    ids=["truncated", "corrupt-deflate", "bad-gzip-header"],
)
def test_archive_extract_refuses_a_damaged_gzip(tmp_path: Path, damage, message: str) -> None:
    """A gzip upload is read by its own reader (not tarfile's stream): its damage is still
    a clear refusal, never an exception of the gzip or zlib modules."""
    whole = _tasks_tar(40, 20).getvalue()
    assert whole[:2] == b"\x1f\x8b"
    assert task_archives.archive_extract(io.BytesIO(whole), tmp_path / "whole").is_dir()
    with pytest.raises(TaskFormatError) as info:
        task_archives.archive_extract(io.BytesIO(damage(whole)), tmp_path / "damaged")
    assert str(info.value).startswith(message), str(info.value)


def _tree(root: Path) -> list[tuple[str, int, bytes]]:
    return [
        (str(p.relative_to(root)), p.lstat().st_mode, p.read_bytes() if p.is_file() else b"")
        for p in sorted(root.rglob("*"))
    ]


def test_a_whole_gzip_is_inflated_in_memory_and_anything_else_is_left_to_gzipfile() -> None:
    """_inflated takes one complete gzip member whose tar fits its limit; for anything else
    it answers None with the upload back where it was, so GzipFile reads it as before."""
    whole = _tasks_tar(3, 2).getvalue()
    tar = gzip.decompress(whole)

    def inflated(data: bytes, *, limit: int = 1 << 20) -> tuple[bytes | None, int]:
        upload = io.BytesIO(b"ab" + data)
        upload.seek(2)
        out = task_archives._inflated(upload, limit=limit)
        return (None if out is None else out.getvalue()), upload.tell()

    assert inflated(whole) == (tar, 2 + len(whole))
    assert inflated(whole, limit=len(tar)) == (tar, 2 + len(whole))
    for name, data, limit in [
        ("two gzip members", whole + gzip.compress(b"more"), 1 << 20),
        ("bytes after the member", whole + b"\0\0", 1 << 20),
        ("truncated", whole[: len(whole) // 2], 1 << 20),
        ("corrupt deflate", whole[:10] + bytes(b ^ 0x5A for b in whole[10:]), 1 << 20),
        ("bad checksum", whole[:-8] + bytes(b ^ 0xFF for b in whole[-8:-4]) + whole[-4:], 1 << 20),
        ("a tar over the limit", whole, len(tar) - 1),
    ]:
        assert inflated(data, limit=limit) == (None, 2), name


def test_an_archive_extracts_the_same_inflated_in_memory_or_read_as_it_inflates(tmp_path: Path) -> None:
    upload = _tasks_tar(4, 3).getvalue()
    in_memory = task_archives.archive_extract(io.BytesIO(upload), tmp_path / "memory")
    streamed = task_archives.archive_extract(io.BytesIO(upload), tmp_path / "streamed", max_inflated_bytes=1)
    # Two gzip members (as `cat a.gz b.gz` makes) are read by GzipFile: the same tree again.
    tar = gzip.decompress(upload)
    two = gzip.compress(tar[:5000]) + gzip.compress(tar[5000:])
    members = task_archives.archive_extract(io.BytesIO(two), tmp_path / "members")
    assert _tree(in_memory) == _tree(streamed) == _tree(members)
    assert len(_tree(in_memory)) == 4 * 5  # four folders of three files and a task.toml


@pytest.mark.parametrize("mode", ["w:gz", "w"])
def test_unpacked_files_keep_their_modes_and_belong_to_the_extracting_process(tmp_path: Path, mode: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, file_mode in (("t/run.sh", 0o775), ("t/data.txt", 0o664)):
            info = _member(name, mode=file_mode)
            info.uid = info.gid = 4321
            info.uname = info.gname = "someone"
            tar.addfile(info, io.BytesIO(b"abc"))
    buf.seek(0)
    root = task_archives.archive_extract(buf, tmp_path / "out")
    for name, want in (("run.sh", 0o755), ("data.txt", 0o644)):
        st = (root / name).stat()  # the archive's one folder is its root
        assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (want, os.geteuid(), os.getegid()), name


@pytest.mark.parametrize("mode", ["w:gz", "w"])
def test_a_hard_link_before_its_target_is_refused(tmp_path: Path, mode: str) -> None:
    """tarfile would read the rest of the archive, past the entry limits, to find it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        tar.addfile(_member("t/early", tarfile.LNKTYPE, link="t/late"))
        tar.addfile(_member("t/late"), io.BytesIO(b"abc"))
    buf.seek(0)
    with pytest.raises(TaskFormatError, match="t/early: hard link to a file that is not before it in the archive"):
        task_archives.archive_extract(buf, tmp_path)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        tar.addfile(_member("t/late"), io.BytesIO(b"abc"))
        tar.addfile(_member("t/early", tarfile.LNKTYPE, link="t/late"))
    buf.seek(0)
    task_archives.archive_extract(buf, tmp_path / "in-order")
    assert (tmp_path / "in-order" / "t" / "early").read_bytes() == b"abc"


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([_member("t/d", tarfile.DIRTYPE), _member("t/h", tarfile.LNKTYPE, link="t/d")], "t/h: hard link to a file"),
        ([_member("t/d", tarfile.DIRTYPE), _member("t/d", tarfile.SYMTYPE, link="x")], "t/d: symlink in the place"),
        # Outside the archive: the extraction filter's own refusal, whether or not it exists.
        ([_member("t/h", tarfile.LNKTYPE, link="../../nothing-here")], "t/h: link points outside the archive"),
        ([_member("t/h", tarfile.LNKTYPE, link="/etc/hostname")], "t/h: link points outside the archive"),
    ],
    ids=["hard-link-to-a-folder", "symlink-over-a-folder", "hard-link-outside", "hard-link-absolute"],
)
def test_links_tarfile_cannot_make_in_place_are_refused(tmp_path: Path, members, message: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info in members:
            tar.addfile(info)
    buf.seek(0)
    with pytest.raises(TaskFormatError, match=f"archive: {message}"):
        task_archives.archive_extract(buf, tmp_path)


def _tasks_tar(tasks: int, files_per_task: int) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for t in range(tasks):
            for f in range(files_per_task):
                info = tarfile.TarInfo(f"task-{t}/file-{f}.txt")
                info.size = 1
                tar.addfile(info, io.BytesIO(b"x"))
            info = tarfile.TarInfo(f"task-{t}/task.toml")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    buf.seek(0)
    return buf


def test_archive_entry_limit_is_per_task(tmp_path: Path) -> None:
    # 30 entries in all, over a limit of 10 for the archive: fine, since no task has more than 10.
    root = task_archives.archive_extract(_tasks_tar(5, 5), tmp_path / "many", max_task_entries=10)
    assert len(list(root.rglob("*.txt"))) == 25
    with pytest.raises(TaskFormatError, match="more than 10 entries per task"):
        task_archives.archive_extract(_tasks_tar(1, 12), tmp_path / "big", max_task_entries=10)
    with pytest.raises(TaskFormatError, match="more than 20 entries"):
        task_archives.archive_extract(_tasks_tar(5, 5), tmp_path / "ceiling", max_task_entries=10, max_members=20)


# Harbor's input checks are left out when they cannot fail (a plain tree); these tasks
# exercise both sides of that shortcut, and the outcome must be Harbor's either way.
def _with_symlink(task: Path) -> None:
    os.symlink("../instruction.md", task / "tests" / "instruction-link.md")


def _with_harborignore_excluding_the_test(task: Path) -> None:
    (task / "tests" / ".harborignore").write_text("test.sh\n")


def _with_harborignore_excluding_nothing(task: Path) -> None:
    (task / "solution" / ".harborignore").write_text("notes.txt\n")


def _with_cache_dir(task: Path) -> None:
    (task / "tests" / "__pycache__").mkdir()
    (task / "tests" / "__pycache__" / "x.cpython-312.pyc").write_bytes(b"\0")


def _without_test_script(task: Path) -> None:
    (task / "tests" / "test.sh").unlink()


def _windows_without_test_bat(task: Path) -> None:
    (task / "task.toml").write_text(TASK_TOML.format(slug="hello") + 'os = "windows"\n')


def _plain(task: Path) -> None:
    pass


_VARIANTS = [
    _plain,
    _with_symlink,
    _with_harborignore_excluding_the_test,
    _with_harborignore_excluding_nothing,
    _with_cache_dir,
    _without_test_script,
    _windows_without_test_bat,
]


def _parse_outcome(task: Path) -> harbor_tasks.ParsedTask | str:
    try:
        return task_dir_parse(task)
    except TaskFormatError as exc:
        return f"error: {exc}"


@pytest.mark.parametrize("variant", _VARIANTS, ids=lambda v: v.__name__)
def test_harbor_shortcut_gives_harbor_checks_outcome(tmp_path: Path, monkeypatch, variant) -> None:
    task = write_task(tmp_path, "hello")
    variant(task)
    shortcut = _parse_outcome(task)
    monkeypatch.setattr(harbor_tasks, "_harbor_checks_trivially_pass", lambda *args, **kwargs: False)
    assert _parse_outcome(task) == shortcut


@pytest.mark.parametrize("slug", EXAMPLE_SLUGS)
def test_harbor_shortcut_gives_harbor_checks_outcome_on_examples(monkeypatch, slug: str) -> None:
    shortcut = task_dir_parse(EXAMPLE_TASKS / slug)
    monkeypatch.setattr(harbor_tasks, "_harbor_checks_trivially_pass", lambda *args, **kwargs: False)
    full = task_dir_parse(EXAMPLE_TASKS / slug)
    assert full == shortcut
    assert full.archive == shortcut.archive and full.local_support == shortcut.local_support


def test_harbor_shortcut_is_taken_only_for_plain_trees(tmp_path: Path, monkeypatch) -> None:
    taken: dict[str, bool] = {}
    real = harbor_tasks._harbor_checks_trivially_pass
    for variant in _VARIANTS:
        task = write_task(tmp_path / variant.__name__, "hello")
        variant(task)

        def spy(*args, _name=variant.__name__, **kwargs):
            taken[_name] = real(*args, **kwargs)
            return taken[_name]

        monkeypatch.setattr(harbor_tasks, "_harbor_checks_trivially_pass", spy)
        _parse_outcome(task)
    assert taken == {
        "_plain": True,
        "_with_symlink": False,
        "_with_harborignore_excluding_the_test": False,
        "_with_harborignore_excluding_nothing": False,
        "_with_cache_dir": False,
        "_without_test_script": False,
        "_windows_without_test_bat": False,
    }
    examples: list[bool] = []
    monkeypatch.setattr(
        harbor_tasks, "_harbor_checks_trivially_pass", lambda *a, **k: examples.append(real(*a, **k)) or examples[-1]
    )
    for slug in EXAMPLE_SLUGS:  # the examples' shape (what a push carries) takes the shortcut
        task_dir_parse(EXAMPLE_TASKS / slug)
    assert examples == [True] * len(EXAMPLE_SLUGS)


def test_task_format_error_survives_pickling() -> None:
    import pickle

    exc = pickle.loads(pickle.dumps(TaskFormatError("hello/task.toml", "missing")))
    assert isinstance(exc, TaskFormatError)
    assert (str(exc), exc.where, exc.problem) == ("hello/task.toml: missing", "hello/task.toml", "missing")
