"""Importing task folders, dataset folders and registries into the database."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.datasets import selectors
from apps.datasets.harbor_tasks import task_dir_parse
from apps.datasets.models import Dataset, DatasetVersion, DatasetVersionTask, TaskVersion
from apps.datasets.services import (
    dataset_import_dir,
    dataset_import_registry,
    dataset_version_resolve,
    task_version_import_dir,
    task_version_materialize,
)
from apps.objects.models import StoredObject
from synth_common.canonical import canonical_digest
from tests.datasets.conftest import EXAMPLE_SLUGS, EXAMPLES, TASK_TOML, write_task

pytestmark = pytest.mark.django_db


def _counts() -> dict[str, int]:
    return {
        m.__name__: m.objects.count() for m in (TaskVersion, Dataset, DatasetVersion, DatasetVersionTask, StoredObject)
    }


def test_import_examples_folder(alice, examples_copy) -> None:
    dv, created = dataset_import_dir(org=alice.org, name="examples", version="1.0", path=examples_copy(1))
    assert created
    assert dv.reference == "team/examples@1.0"
    assert dv.task_count == len(EXAMPLE_SLUGS)
    entries = selectors.dataset_version_entries(dataset_version=dv)
    assert [e.position for e in entries] == list(range(len(EXAMPLE_SLUGS)))
    assert [e.task_version.name for e in entries] == [f"synth-examples/{s}" for s in EXAMPLE_SLUGS]
    assert dv.digest == canonical_digest([e.task_version.digest for e in entries])

    memory = next(e.task_version for e in entries if e.task_version.name.endswith("count-primes-memory"))
    assert memory.memory_mb == 3072 and memory.cpus == 1 and memory.has_solution and memory.has_dockerfile
    assert memory.config["environment"]["workdir"] == "/app"
    assert memory.agent_timeout_sec == 900 and memory.verifier_timeout_sec == 120
    assert memory.archive.sha256 == memory.digest and memory.archive.org == alice.org
    offline = TaskVersion.objects.get(org=alice.org, name="synth-examples/offline-checksums")
    assert offline.config["environment"]["network_mode"] == "no-network"
    assert "SHA256SUMS" in offline.instruction


def test_digests_are_stable_across_copies_with_different_mtimes(alice, examples_copy) -> None:
    first, created = dataset_import_dir(org=alice.org, name="examples", version="1.0", path=examples_copy(1))
    before = _counts()
    again, created_again = dataset_import_dir(org=alice.org, name="examples", version="1.0", path=examples_copy(2))
    assert created and not created_again
    assert again.id == first.id and again.digest == first.digest
    assert _counts() == before
    # Another version with the same content reuses every task version (same digest, same org).
    other, created_other = dataset_import_dir(org=alice.org, name="examples", version="1.1", path=examples_copy(3))
    assert created_other and other.digest == first.digest and other.id != first.id
    assert TaskVersion.objects.count() == before["TaskVersion"]
    assert StoredObject.objects.count() == before["StoredObject"]


def test_same_version_with_different_content_conflicts(alice, examples_copy) -> None:
    dataset_import_dir(org=alice.org, name="examples", version="1.0", path=examples_copy(1))
    changed = examples_copy(2)
    (changed / "word-frequencies" / "instruction.md").write_text("Count the words.\n")
    before = _counts()
    with pytest.raises(Conflict, match="team/examples@1.0 already exists with different content"):
        dataset_import_dir(org=alice.org, name="examples", version="1.0", path=changed)
    assert _counts() == before


def _break_missing_test(task: Path) -> str:
    (task / "tests" / "test.sh").unlink()
    return "zz-broken/tests/test.sh: missing"


def _break_toml_syntax(task: Path) -> str:
    (task / "task.toml").write_text('schema_version = "1.4"\n[task]\nname = = "x/y"\n')
    return "zz-broken/task.toml: line 3, column 8: invalid TOML"


def _break_toml_type(task: Path) -> str:
    (task / "task.toml").write_text(TASK_TOML.format(slug="zz-broken").replace("cpus = 1", 'cpus = "many"'))
    return "zz-broken/task.toml: line 13: [environment].cpus: expected int or float (got 'many')"


def _break_missing_instruction(task: Path) -> str:
    (task / "instruction.md").unlink()
    return "zz-broken/instruction.md: missing"


@pytest.mark.parametrize(
    "breaker", [_break_missing_test, _break_toml_syntax, _break_toml_type, _break_missing_instruction]
)
def test_malformed_task_rejects_the_whole_dataset(alice, examples_copy, breaker) -> None:
    root = examples_copy(1)
    # Sorted last, so every valid task before it has been parsed: still nothing is stored.
    expected = breaker(write_task(root, "zz-broken"))
    before = _counts()
    with pytest.raises(ValidationFailed) as info:
        dataset_import_dir(org=alice.org, name="examples", version="1.0", path=root)
    assert info.value.message.startswith(expected), info.value.message
    assert _counts() == before


def test_folder_without_tasks_is_rejected(alice, tmp_path) -> None:
    with pytest.raises(ValidationFailed, match="no task folders found"):
        dataset_import_dir(org=alice.org, name="empty", version="1", path=tmp_path)


def test_bad_name_or_version(alice, tmp_path) -> None:
    with pytest.raises(ValidationFailed) as info:
        dataset_import_dir(org=alice.org, name="a/b", version="1", path=tmp_path)
    assert info.value.field == "name"
    with pytest.raises(ValidationFailed) as info:
        dataset_import_dir(org=alice.org, name="ok", version="1@2", path=tmp_path)
    assert info.value.field == "version"


def test_registry_import_matches_folder_import(alice, examples_copy) -> None:
    folder_dv, _ = dataset_import_dir(org=alice.org, name="examples", version="1.0", path=examples_copy(1))
    registry_dv, created = dataset_import_registry(
        org=alice.org, registry_path=EXAMPLES / "registry.json", name="examples", version="1.1"
    )
    # A single-dataset registry is imported under the caller's version label.
    assert created and registry_dv.reference == "team/examples@1.1"
    assert registry_dv.digest == folder_dv.digest


def test_registry_git_url_is_rejected(alice, tmp_path) -> None:
    shutil.copytree(EXAMPLES / "tasks" / "implement-roman", tmp_path / "tasks" / "implement-roman")
    registry = tmp_path / "registry.json"
    registry.write_text(
        json.dumps(
            [
                {
                    "name": "mixed",
                    "version": "1",
                    "description": "",
                    "tasks": [
                        {"name": "roman", "path": "tasks/implement-roman"},
                        {
                            "name": "remote",
                            "path": "t",
                            "git_url": "https://github.com/o/r.git",
                            "git_commit_id": "abc",
                        },
                    ],
                }
            ]
        )
    )
    before = _counts()
    with pytest.raises(
        ValidationFailed, match=r"registry.json: mixed@1: tasks\[1\] \(remote\): git_url .* not supported"
    ):
        dataset_import_registry(org=alice.org, registry_path=registry, name="mixed", version="1")
    assert _counts() == before


def test_resolve(alice, bob, examples_copy) -> None:
    dv, _ = dataset_import_dir(org=alice.org, name="examples", version="1.0", path=examples_copy(1))
    assert dataset_version_resolve(org=alice.org, reference="team/examples@1.0") == dv
    for bad in ("examples@1.0", "team/examples", "team/examples@", "a/b/c@1", ""):
        with pytest.raises(ValidationFailed, match="expected ORG/NAME@VERSION"):
            dataset_version_resolve(org=alice.org, reference=bad)
    with pytest.raises(NotFound, match="dataset team/examples@2.0 not found"):
        dataset_version_resolve(org=alice.org, reference="team/examples@2.0")
    # Another org cannot see it, whether it names alice's org or its own.
    for reference in ("team/examples@1.0", "rival/examples@1.0"):
        with pytest.raises(NotFound):
            dataset_version_resolve(org=bob.org, reference=reference)


def test_task_version_import_is_idempotent_and_materializes(alice, bob, tmp_path) -> None:
    task = write_task(tmp_path / "src", "hello")
    tv = task_version_import_dir(org=alice.org, path=task)
    assert task_version_import_dir(org=alice.org, path=task).id == tv.id
    # Same content in another org: a separate row (and a separate object reference).
    tv_bob = task_version_import_dir(org=bob.org, path=task)
    assert tv_bob.id != tv.id and tv_bob.digest == tv.digest and tv_bob.archive.org == bob.org
    unpacked = task_version_materialize(task_version=tv, dest=tmp_path / "out" / "hello")
    assert task_dir_parse(unpacked).digest == tv.digest
    assert (unpacked / "tests" / "test.sh").stat().st_mode & 0o111


def test_import_command(alice, examples_copy, capsys) -> None:
    path = examples_copy(1)
    call_command("import_dataset", "--org", "team", "--name", "examples", "--version", "1.0", str(path))
    out = capsys.readouterr().out
    assert f"team/examples@1.0 imported: {len(EXAMPLE_SLUGS)} tasks" in out
    call_command(
        "import_dataset", "--org", "team", "--name", "examples", "--version", "1.0", str(EXAMPLES / "registry.json")
    )
    assert "already present" in capsys.readouterr().out
    with pytest.raises(CommandError, match="no organization 'nope'"):
        call_command("import_dataset", "--org", "nope", "--name", "x", "--version", "1", str(path))
    broken = path.parent / "broken"
    write_task(broken, "hello")
    (broken / "hello" / "instruction.md").unlink()
    with pytest.raises(CommandError, match="hello/instruction.md: missing"):
        call_command("import_dataset", "--org", "team", "--name", "x", "--version", "1", str(broken))


@pytest.fixture
def parse_in_workers(settings, monkeypatch) -> list[int]:
    """Parse even a handful of tasks in two worker processes (normally only large imports);
    the list records the pools started."""
    from apps.datasets import services

    settings.SYNTH_TASK_PARSE_WORKERS = 2
    monkeypatch.setattr(services, "PARALLEL_PARSE_MIN_TASKS", 1)
    pools: list[int] = []
    real = services.ProcessPoolExecutor

    def recording(*args, **kwargs):
        pools.append(kwargs["max_workers"])
        return real(*args, **kwargs)

    monkeypatch.setattr(services, "ProcessPoolExecutor", recording)
    return pools


def test_parse_in_workers_gives_the_same_versions(alice, bob, examples_copy, settings, parse_in_workers) -> None:
    settings.SYNTH_TASK_PARSE_WORKERS = 1
    in_process, _ = dataset_import_dir(org=alice.org, name="examples", version="1.0", path=examples_copy(1))
    assert parse_in_workers == []
    settings.SYNTH_TASK_PARSE_WORKERS = 2
    in_workers, _ = dataset_import_dir(org=bob.org, name="examples", version="1.0", path=examples_copy(2))
    assert parse_in_workers == [2]
    assert in_workers.digest == in_process.digest
    fields = ("name", "digest", "config", "instruction", "local_support", "has_dockerfile", "has_solution")
    rows = [
        list(TaskVersion.objects.filter(org=org).order_by("name").values_list(*fields)) for org in (alice.org, bob.org)
    ]
    assert rows[0] == rows[1] and len(rows[0]) == len(EXAMPLE_SLUGS)
    # The stored archives are the same bytes (content-addressed: one object per digest).
    assert sorted(StoredObject.objects.filter(org=bob.org).values_list("sha256", flat=True)) == sorted(
        StoredObject.objects.filter(org=alice.org).values_list("sha256", flat=True)
    )


@pytest.mark.parametrize("breaker", [_break_missing_test, _break_toml_type])
def test_parse_in_workers_refuses_the_first_malformed_task(alice, examples_copy, parse_in_workers, breaker) -> None:
    root = examples_copy(1)
    expected = breaker(write_task(root, "zz-broken"))
    # A second broken task sorted after the first: the first one (in order) is named.
    (write_task(root, "zzz-broken") / "instruction.md").unlink()
    before = _counts()
    with pytest.raises(ValidationFailed) as info:
        dataset_import_dir(org=alice.org, name="examples", version="1.0", path=root)
    assert info.value.message.startswith(expected), info.value.message
    assert _counts() == before
    assert parse_in_workers == [2]


@pytest.fixture
def early_parse(parse_in_workers, monkeypatch) -> dict[str, bool]:
    """Archives' task folders handed to the workers as soon as the stream moves past each
    (one per message); the dict records, per folder, whether its early parse was used."""
    from apps.datasets import services

    monkeypatch.setattr(services, "PARALLEL_PARSE_CHUNK", 1)
    used: dict[str, bool] = {}
    real = services._EarlyParse.results

    def recording(self, *, dirs, field):
        used.update({d.name: self._early(d.relative_to(self.dest).as_posix()) is not None for d in dirs})
        return real(self, dirs=dirs, field=field)

    monkeypatch.setattr(services._EarlyParse, "results", recording)
    return used


def _rows(org) -> list[tuple]:
    fields = ("name", "digest", "config", "instruction", "local_support", "has_dockerfile", "has_solution")
    return list(TaskVersion.objects.filter(org=org).order_by("name").values_list(*fields))


def test_an_archive_parsed_as_it_unpacks_gives_the_folders_versions(
    alice, bob, examples_copy, settings, early_parse, parse_in_workers
) -> None:
    from apps.datasets.services import dataset_import_archive
    from tests.datasets.conftest import tar_gz

    settings.SYNTH_TASK_PARSE_WORKERS = 1
    reference, _ = dataset_import_dir(org=alice.org, name="examples", version="1.0", path=examples_copy(1))
    settings.SYNTH_TASK_PARSE_WORKERS = 2
    dv, created = dataset_import_archive(
        org=bob.org, name="examples", version="1.0", archive=tar_gz(examples_copy(2), arcname="tasks")
    )
    assert created and dv.digest == reference.digest
    assert _rows(bob.org) == _rows(alice.org) and len(_rows(bob.org)) == len(EXAMPLE_SLUGS)
    assert parse_in_workers == [2]
    # Every folder the stream moved past was parsed early; the last one only at the end.
    assert early_parse == {slug: slug != EXAMPLE_SLUGS[-1] for slug in EXAMPLE_SLUGS}


def _tar_with(root: Path, *, extra: list[tuple[tarfile.TarInfo, bytes | None]]) -> io.BytesIO:
    """A tar.gz of root's task folders (sorted, as the CLI packs), then the ``extra`` members."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for child in sorted(root.iterdir()):
            tar.add(child, arcname=child.name)
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return buf


def test_a_folder_the_archive_comes_back_to_is_parsed_once_it_is_unpacked(
    alice, bob, examples_copy, early_parse
) -> None:
    from apps.datasets.services import dataset_import_archive

    first, second = EXAMPLE_SLUGS[0], EXAMPLE_SLUGS[1]
    text = b"The last word: this instruction replaces the first.\n"
    info = tarfile.TarInfo(f"{first}/instruction.md")
    info.size, info.mode = len(text), 0o644
    dv, _ = dataset_import_archive(
        org=bob.org, name="examples", version="1.0", archive=_tar_with(examples_copy(2), extra=[(info, text)])
    )
    # The member at the end replaced the file the early parse may have read: parsed again.
    assert early_parse[first] is False and early_parse[second] is True
    assert TaskVersion.objects.filter(org=bob.org, instruction=text.decode()).count() == 1
    expected = examples_copy(1)
    (expected / first / "instruction.md").write_bytes(text)
    reference, _ = dataset_import_dir(org=alice.org, name="examples", version="1.0", path=expected)
    assert dv.digest == reference.digest


def test_an_archive_with_a_link_is_parsed_once_it_is_unpacked(alice, bob, examples_copy, early_parse) -> None:
    from apps.datasets.services import dataset_import_archive

    # A link could make a folder the stream moved past change under another name.
    info = tarfile.TarInfo(f"{EXAMPLE_SLUGS[-1]}/tests/again.sh")
    info.type, info.linkname = tarfile.SYMTYPE, "test.sh"
    dv, _ = dataset_import_archive(
        org=bob.org, name="examples", version="1.0", archive=_tar_with(examples_copy(2), extra=[(info, None)])
    )
    assert set(early_parse.values()) == {False} and len(early_parse) == len(EXAMPLE_SLUGS)
    expected = examples_copy(1)
    (expected / EXAMPLE_SLUGS[-1] / "tests" / "again.sh").symlink_to("test.sh")
    reference, _ = dataset_import_dir(org=alice.org, name="examples", version="1.0", path=expected)
    assert dv.digest == reference.digest


@pytest.mark.parametrize("breaker", [_break_missing_test, _break_toml_type])
def test_an_archive_parsed_as_it_unpacks_refuses_the_first_malformed_task(
    alice, examples_copy, early_parse, breaker
) -> None:
    from apps.datasets.services import dataset_import_archive
    from tests.datasets.conftest import tar_gz

    root = examples_copy(1)
    # Sorted first, so parsed early; a second broken task after it is not the one named.
    expected = breaker(write_task(root, "a-broken")).replace("zz-broken", "a-broken", 1)
    (write_task(root, "zz-broken") / "instruction.md").unlink()
    before = _counts()
    with pytest.raises(ValidationFailed) as info:
        dataset_import_archive(org=alice.org, name="examples", version="1.0", archive=tar_gz(root))
    assert info.value.message.startswith(expected) and info.value.field == "archive", info.value.message
    assert early_parse["a-broken"] is True
    assert _counts() == before


def _scratch_spy(monkeypatch) -> list[Path]:
    """Records the folders archives are unpacked in."""
    from apps.datasets import services, task_archives

    dests: list[Path] = []
    real = task_archives.archive_extract

    def spy(fileobj, dest, **kwargs):
        dests.append(dest)
        return real(fileobj, dest, **kwargs)

    monkeypatch.setattr(services.task_archives, "archive_extract", spy)
    return dests


def test_archive_is_unpacked_in_the_configured_scratch_folder(alice, examples_copy, settings, tmp_path, monkeypatch):
    from apps.datasets.services import dataset_import_archive
    from tests.datasets.conftest import tar_gz

    settings.SYNTH_TASK_IMPORT_SCRATCH = str(tmp_path / "scratch")
    (tmp_path / "scratch").mkdir()
    dests = _scratch_spy(monkeypatch)
    dv, created = dataset_import_archive(
        org=alice.org, name="examples", version="1.0", archive=tar_gz(examples_copy(1))
    )
    assert created and dv.task_count == len(EXAMPLE_SLUGS)
    assert len(dests) == 1 and dests[0].is_relative_to(tmp_path / "scratch")
    assert list((tmp_path / "scratch").iterdir()) == []  # removed after the import


def test_full_memory_scratch_falls_back_to_disk(alice, examples_copy, settings, tmp_path, monkeypatch):
    import errno

    from apps.datasets import services, task_archives
    from apps.datasets.services import dataset_import_archive
    from tests.datasets.conftest import tar_gz

    settings.SYNTH_TASK_IMPORT_SCRATCH = ""
    memory = tmp_path / "memory"
    memory.mkdir()
    monkeypatch.setattr(services, "MEMORY_SCRATCH", str(memory))
    dests: list[Path] = []
    real = task_archives.archive_extract

    def filling(fileobj, dest, **kwargs):
        dests.append(dest)
        if dest.is_relative_to(memory):
            fileobj.read(100)  # part of the stream is consumed before the space runs out
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fileobj, dest, **kwargs)

    monkeypatch.setattr(services.task_archives, "archive_extract", filling)
    reference, _ = dataset_import_dir(org=alice.org, name="examples", version="0.1", path=examples_copy(2))
    dv, created = dataset_import_archive(
        org=alice.org, name="examples", version="1.0", archive=tar_gz(examples_copy(1))
    )
    assert created and dv.digest == reference.digest
    assert len(dests) == 2 and dests[0].is_relative_to(memory) and not dests[1].is_relative_to(memory)
    assert list(memory.iterdir()) == []
