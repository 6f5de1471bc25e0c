"""Writes: import Harbor tasks as immutable task versions and ordered dataset versions.

Parsing and archiving happen first, outside any transaction (apps.datasets.harbor_tasks);
only when every task of a dataset is valid are the archives stored and the rows written,
in one transaction, so a malformed task leaves no rows behind. Archive bytes that reach
the object store before a rollback are harmless: they are content-addressed blobs that
no row references.
"""

from __future__ import annotations

import errno
import fnmatch
import multiprocessing
import os
import posixpath
import re
import tarfile
import tempfile
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import IntegrityError, transaction
from rest_framework import status

from apps.accounts.models import Organization
from apps.core.bulk import rows_copy
from apps.core.errors import Conflict, NotFound, ServiceError, ValidationFailed
from apps.datasets import harbor_tasks, task_archives
from apps.datasets.errors import TaskFormatError
from apps.datasets.harbor_tasks import ParsedTask
from apps.datasets.models import Dataset, DatasetVersion, DatasetVersionTask, TaskVersion
from apps.datasets.selectors import dataset_version_get, dataset_version_local_unsupported
from apps.objects.services import objects_put_many

DATASET_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
DATASET_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
REFERENCE_RE = re.compile(r"^(?P<org>[^/@\s]+)/(?P<name>[^/@\s]+)@(?P<version>[^/@\s]+)$")
MAX_REGISTRY_BYTES = 4 * 1024 * 1024
# Rows per statement when a dataset's tasks are stored (bounded parameter lists).
STORE_CHUNK = 500
# A dataset of fewer tasks per worker is parsed in the request's process: starting a
# worker (interpreter, Harbor's models) costs about as much as parsing that many tasks.
PARALLEL_PARSE_MIN_TASKS = 100
# Tasks per message to a parse worker (amortises pickling round trips).
PARALLEL_PARSE_CHUNK = 50
MEMORY_SCRATCH = "/dev/shm"


class ArchiveTooLarge(ServiceError):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    error_type = "request_too_large"


def _name_version_check(*, name: str, version: str) -> None:
    if not DATASET_NAME_RE.match(name or ""):
        raise ValidationFailed(
            "dataset name must be 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit",
            field="name",
        )
    if not DATASET_VERSION_RE.match(version or ""):
        raise ValidationFailed(
            "version must be 1-64 letters, digits, '.', '_', '+' or '-', starting with a letter or digit",
            field="version",
        )


def _task_parse(path: Path, *, label: str | None = None, field: str | None = None) -> ParsedTask:
    try:
        return harbor_tasks.task_dir_parse(
            path,
            label=label,
            max_file_bytes=settings.SYNTH_TASK_MAX_FILE_BYTES,
            max_task_bytes=settings.SYNTH_TASK_MAX_BYTES,
        )
    except TaskFormatError as exc:
        raise ValidationFailed(str(exc), field=field) from None


def _tasks_parse(*, paths: list[Path], labels: list[str], field: str | None) -> list[ParsedTask]:
    """`_task_parse` of every folder, in order; the first invalid one (in order) is refused.

    A large dataset is parsed by a few worker processes (settings.SYNTH_TASK_PARSE_WORKERS):
    each task's parse is independent CPU work, most of a push's time. Spawned, not forked:
    the request's process has threads and database connections a fork would copy.
    """
    workers = min(settings.SYNTH_TASK_PARSE_WORKERS, len(paths) // PARALLEL_PARSE_MIN_TASKS)
    if workers <= 1:
        return [_task_parse(path, label=label, field=field) for path, label in zip(paths, labels, strict=True)]
    limits = {"max_file_bytes": settings.SYNTH_TASK_MAX_FILE_BYTES, "max_task_bytes": settings.SYNTH_TASK_MAX_BYTES}
    chunk = max(1, min(PARALLEL_PARSE_CHUNK, len(paths) // (workers * 4)))
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            # map yields in order and, at the first refusal, cancels the chunks not yet
            # started: the error is the first invalid task's, as parsing in order gives.
            return list(
                pool.map(harbor_tasks.task_dir_parse_in_worker, paths, labels, [limits] * len(paths), chunksize=chunk)
            )
        except TaskFormatError as exc:
            raise ValidationFailed(str(exc), field=field) from None


class _EarlyParse:
    """Parses an uploaded archive's task folders while the rest of it still unpacks.

    Unpacking runs on one core; a task folder the tar stream has moved past can already be
    parsed on the other. A folder is handed to the parse workers when a member outside it
    follows its task.toml. Its early result is used only if the folder is still as it was
    then: no later member is named inside it, and the archive holds no link at all (a
    link, or a path through a symlinked folder, could change a folder under another name).
    Every other task folder is parsed once the archive is unpacked, as before; the result
    is the same as parsing all of them then, and the first refused task (in order) is named.
    Small archives never start the workers (see `_tasks_parse`).
    """

    def __init__(self, *, dest: Path) -> None:
        self.dest = dest
        self.workers = settings.SYNTH_TASK_PARSE_WORKERS
        self.limits = {
            "max_file_bytes": settings.SYNTH_TASK_MAX_FILE_BYTES,
            "max_task_bytes": settings.SYNTH_TASK_MAX_BYTES,
        }
        self.pool: ProcessPoolExecutor | None = None
        self.open: str | None = None  # the folder of the last task.toml, while members go into it
        self.closed: list[str] = []  # moved past, not handed to a worker yet
        self.handed: dict[str, tuple[Future[list[Any]], int]] = {}  # folder -> (its chunk's result, index)
        self.changed: set[str] = set()  # handed folders a later member went into
        self.linked = False
        self.tasks = 0

    def __enter__(self) -> _EarlyParse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def member(self, member: tarfile.TarInfo) -> None:
        """One member is on disk (archive_extract's ``on_member``)."""
        name = posixpath.normpath(member.name)
        if self.open is not None and not (name == self.open or name.startswith(self.open + "/")):
            self.closed.append(self.open)
            self.open = None
        if member.issym() or member.islnk():
            self.linked = True
        if self.handed:
            prefix = ""
            for part in name.split("/"):
                prefix = f"{prefix}/{part}" if prefix else part
                if prefix in self.handed:
                    self.changed.add(prefix)
        if self.open is None and posixpath.basename(name) == "task.toml":
            self.open = posixpath.dirname(name)
            self.tasks += 1
            if self.pool is None and self.workers > 1 and self.tasks >= self.workers * PARALLEL_PARSE_MIN_TASKS:
                self.pool = ProcessPoolExecutor(
                    max_workers=self.workers, mp_context=multiprocessing.get_context("spawn")
                )
        while self.pool is not None and len(self.closed) >= PARALLEL_PARSE_CHUNK:
            self._hand(self.closed[:PARALLEL_PARSE_CHUNK])
            del self.closed[:PARALLEL_PARSE_CHUNK]

    def _hand(self, folders: list[str]) -> None:
        assert self.pool is not None
        future = self.pool.submit(
            harbor_tasks.task_dirs_parse_in_worker,
            [self.dest / f for f in folders],
            [posixpath.basename(f) for f in folders],
            self.limits,
        )
        for index, folder in enumerate(folders):
            self.handed[folder] = (future, index)

    def _early(self, folder: str) -> tuple[Future[list[Any]], int] | None:
        if self.linked or folder in self.changed:
            return None
        return self.handed.get(folder)

    def results(self, *, dirs: list[Path], field: str | None) -> list[ParsedTask]:
        """The parse of every task folder (``dirs``, found once the archive is unpacked), in order."""
        if self.pool is None:
            return _tasks_parse(paths=dirs, labels=[d.name for d in dirs], field=field)
        keys = [d.relative_to(self.dest).as_posix() for d in dirs]
        self.handed = {key: early for key in keys if (early := self._early(key)) is not None}
        late = [key for key in keys if key not in self.handed]
        for start in range(0, len(late), PARALLEL_PARSE_CHUNK):
            self._hand(late[start : start + PARALLEL_PARSE_CHUNK])
        tasks: list[ParsedTask] = []
        for key in keys:
            future, index = self.handed[key]
            parsed = future.result()[index]
            if isinstance(parsed, TaskFormatError):
                self.close()  # the tasks after it are not needed
                raise ValidationFailed(str(parsed), field=field)
            tasks.append(parsed)
        self.close()
        return tasks


def _names_unique_check(*, tasks: list[ParsedTask], labels: list[str], field: str | None) -> None:
    """Runs, trials and results name a dataset's tasks: two with one name could not be told apart."""
    seen: dict[str, str] = {}
    for parsed, label in zip(tasks, labels, strict=True):
        if parsed.name in seen:
            raise ValidationFailed(
                f"{label}: task name {parsed.name!r} is also the name of {seen[parsed.name]}; "
                "task names must be unique within a dataset version",
                field=field,
            )
        seen[parsed.name] = label


def _task_version_fields(parsed: ParsedTask) -> dict[str, Any]:
    return {
        "name": parsed.name,
        "config": parsed.config_json,
        "instruction": parsed.instruction,
        "agent_timeout_sec": parsed.agent_timeout_sec,
        "verifier_timeout_sec": parsed.verifier_timeout_sec,
        "cpus": parsed.cpus,
        "memory_mb": parsed.memory_mb,
        "storage_mb": parsed.storage_mb,
        "docker_image": parsed.docker_image,
        "has_dockerfile": parsed.has_dockerfile,
        "has_solution": parsed.has_solution,
        "local_support": parsed.local_support,
    }


def _task_versions_store(*, org: Organization, tasks: list[ParsedTask]) -> dict[str, str]:
    """The ids of the org's task versions for these contents, by digest: the existing ones,
    and new ones for the rest. A few statements per thousand tasks, not a few per task;
    only ids are read back (whole rows, their configs decoded, were a second per 10,000).

    Must run inside the caller's transaction: the StoredObject rows commit with the tasks.
    """
    unique = {parsed.digest: parsed for parsed in tasks}
    found: dict[str, str] = {}
    digests = list(unique)
    for start in range(0, len(digests), STORE_CHUNK):
        found.update(_task_version_ids(org=org, digests=digests[start : start + STORE_CHUNK]))
    new = [unique[d] for d in digests if d not in found]
    if not new:
        return found
    archives = objects_put_many(
        org=org, blobs=[p.archive for p in new], content_type=task_archives.ARCHIVE_CONTENT_TYPE
    )
    for start in range(0, len(new), STORE_CHUNK):
        batch = new[start : start + STORE_CHUNK]
        # ignore_conflicts: a concurrent import of the same content may have won; its row
        # is read back like ours.
        rows_copy(
            objs=[
                TaskVersion(org=org, digest=p.digest, archive=archives[p.digest], **_task_version_fields(p))
                for p in batch
            ],
            ignore_conflicts=True,
        )
        found.update(_task_version_ids(org=org, digests=[p.digest for p in batch]))
    return found


def _task_version_ids(*, org: Organization, digests: list[str]) -> dict[str, str]:
    return dict(TaskVersion.objects.filter(org=org, digest__in=digests).values_list("digest", "id"))


def _task_version_store(*, org: Organization, parsed: ParsedTask) -> TaskVersion:
    """The org's task version for this content: the existing one, or a new one."""
    return TaskVersion.objects.get(pk=_task_versions_store(org=org, tasks=[parsed])[parsed.digest])


def task_version_import_dir(*, org: Organization, path: Path | str) -> TaskVersion:
    """Import one Harbor task folder; the same content in the same org gives the same row."""
    parsed = _task_parse(Path(path))
    with transaction.atomic():
        return _task_version_store(org=org, parsed=parsed)


def _conflict(reference: str, existing: str, new: str) -> Conflict:
    return Conflict(
        f"dataset {reference} already exists with different content "
        f"(digest {existing[:12]}..., this import {new[:12]}...); publish it under a new version",
        field="version",
    )


def _dataset_version_store(
    *, org: Organization, name: str, version: str, tasks: list[ParsedTask]
) -> tuple[DatasetVersion, bool]:
    """Write the dataset version for `tasks` (in order): (version, created).

    The same name@version with the same digest is the same import (idempotent); with a
    different digest it is a conflict, since versions are immutable once referenced.
    """
    digest = harbor_tasks.dataset_digest([t.digest for t in tasks])
    reference = f"{org.slug}/{name}@{version}"

    def existing_or_conflict(existing: DatasetVersion) -> tuple[DatasetVersion, bool]:
        if existing.digest != digest:
            raise _conflict(reference, existing.digest, digest)
        return existing, False

    # Cheap check first: re-importing an existing version stores nothing.
    existing = dataset_version_get(org=org, name=name, version=version)
    if existing is not None:
        return existing_or_conflict(existing)

    with transaction.atomic():
        dataset, _ = Dataset.objects.get_or_create(org=org, name=name)
        by_digest = _task_versions_store(org=org, tasks=tasks)
        try:
            with transaction.atomic():
                dataset_version = DatasetVersion.objects.create(
                    dataset=dataset, version=version, digest=digest, task_count=len(tasks)
                )
        except IntegrityError:
            # A concurrent import of the same name@version committed first.
            return existing_or_conflict(DatasetVersion.objects.get(dataset=dataset, version=version))
        rows_copy(
            objs=[
                DatasetVersionTask(
                    dataset_version=dataset_version, position=position, task_version_id=by_digest[parsed.digest]
                )
                for position, parsed in enumerate(tasks)
            ],
            batch_size=STORE_CHUNK,
        )
    return dataset_version, True


def _dataset_import_task_dirs(
    *, org: Organization, name: str, version: str, root: Path, field: str | None, early: _EarlyParse | None = None
) -> tuple[DatasetVersion, bool]:
    try:
        dirs = harbor_tasks.task_dirs_discover(root)
    except TaskFormatError as exc:
        raise ValidationFailed(str(exc), field=field) from None
    if early is not None:  # some were parsed as the archive unpacked
        tasks = early.results(dirs=dirs, field=field)
    else:
        tasks = _tasks_parse(paths=dirs, labels=[d.name for d in dirs], field=field)
    _names_unique_check(tasks=tasks, labels=[d.name for d in dirs], field=field)
    return _dataset_version_store(org=org, name=name, version=version, tasks=tasks)


def dataset_import_dir(*, org: Organization, name: str, version: str, path: Path | str) -> tuple[DatasetVersion, bool]:
    """Import a folder of task folders (each immediate subfolder with task.toml, by name)."""
    _name_version_check(name=name, version=version)
    return _dataset_import_task_dirs(org=org, name=name, version=version, root=Path(path), field=None)


def _registry_tasks(
    *,
    data: bytes,
    name: str,
    version: str,
    bases: list[Path],
    confine_to: Path | None,
    where: str,
    field: str | None,
) -> list[ParsedTask]:
    try:
        specs = harbor_tasks.registry_parse(data, where=where)
        for i, base in enumerate(bases):
            try:
                entries = harbor_tasks.registry_tasks_resolve(
                    specs, name=name, version=version, base_dir=base, confine_to=confine_to, where=where
                )
                break
            except TaskFormatError:
                if i == len(bases) - 1:
                    raise
    except TaskFormatError as exc:
        raise ValidationFailed(str(exc), field=field) from None
    tasks = _tasks_parse(
        paths=[entry.path for entry in entries], labels=[entry.path.name for entry in entries], field=field
    )
    labels = [f"{where}: tasks[{i}] ({entry.name})" for i, entry in enumerate(entries)]
    _names_unique_check(tasks=tasks, labels=labels, field=field)
    return tasks


def dataset_import_registry(
    *, org: Organization, registry_path: Path | str, name: str, version: str
) -> tuple[DatasetVersion, bool]:
    """Import dataset `name@version` of a Harbor legacy registry.json (local task paths only).

    Task paths are relative to the registry file. A registry holding a single dataset is
    imported whatever its own name/version (the caller names the imported version).
    """
    _name_version_check(name=name, version=version)
    registry_path = Path(registry_path)
    try:
        data = registry_path.read_bytes()
    except OSError as exc:
        raise ValidationFailed(f"{registry_path}: cannot read ({exc.strerror})") from None
    tasks = _registry_tasks(
        data=data,
        name=name,
        version=version,
        bases=[registry_path.resolve().parent],
        confine_to=None,
        where=registry_path.name,
        field=None,
    )
    return _dataset_version_store(org=org, name=name, version=version, tasks=tasks)


def dataset_import_path(*, org: Organization, name: str, version: str, path: Path | str) -> tuple[DatasetVersion, bool]:
    """A folder of tasks, or a registry.json file (what the management command takes)."""
    path = Path(path)
    if path.is_file():
        return dataset_import_registry(org=org, registry_path=path, name=name, version=version)
    return dataset_import_dir(org=org, name=name, version=version, path=path)


def _import_scratch_dir() -> str | None:
    """The folder an uploaded archive is unpacked in (None: the system's temporary folder).

    See settings.SYNTH_TASK_IMPORT_SCRATCH. Room is checked per import: memory-backed
    space is shared, and running out half-way would fail the import.
    """
    if settings.SYNTH_TASK_IMPORT_SCRATCH:
        return settings.SYNTH_TASK_IMPORT_SCRATCH
    try:
        st = os.statvfs(MEMORY_SCRATCH)
    except OSError:
        return None
    room = st.f_bavail * st.f_frsize
    if room < 2 * settings.SYNTH_TASK_MAX_ARCHIVE_BYTES or not os.access(MEMORY_SCRATCH, os.W_OK | os.X_OK):
        return None
    return MEMORY_SCRATCH


def dataset_import_archive(
    *,
    org: Organization,
    name: str,
    version: str,
    archive: IO[bytes],
    archive_size: int | None = None,
    registry: bytes | None = None,
) -> tuple[DatasetVersion, bool]:
    """Import an uploaded tar / tar.gz of a folder of tasks, optionally with a registry.json.

    Registry task paths are relative to the archive's top level (or to its single
    top-level folder, if the archive wraps everything in one) and may not leave it.
    """
    _name_version_check(name=name, version=version)
    if archive_size is not None and archive_size > settings.SYNTH_TASK_MAX_ARCHIVE_BYTES:
        raise ArchiveTooLarge(
            f"archive is {archive_size} bytes, over the limit of {settings.SYNTH_TASK_MAX_ARCHIVE_BYTES} bytes",
            field="archive",
        )
    if registry is not None and len(registry) > MAX_REGISTRY_BYTES:
        raise ArchiveTooLarge(f"registry is over the limit of {MAX_REGISTRY_BYTES} bytes", field="registry")
    scratch = _import_scratch_dir()
    rewind = archive.tell() if scratch is not None and archive.seekable() else None
    try:
        return _dataset_import_unpacked(
            org=org, name=name, version=version, archive=archive, registry=registry, scratch=scratch
        )
    except OSError as exc:
        # Memory-backed scratch space is shared and was only checked for room up front:
        # if it fills up half-way, the archive is unpacked again on disk.
        if exc.errno != errno.ENOSPC or rewind is None:
            raise
    archive.seek(rewind)
    return _dataset_import_unpacked(
        org=org, name=name, version=version, archive=archive, registry=registry, scratch=None
    )


def _dataset_import_unpacked(
    *, org: Organization, name: str, version: str, archive: IO[bytes], registry: bytes | None, scratch: str | None
) -> tuple[DatasetVersion, bool]:
    with tempfile.TemporaryDirectory(prefix="synth-dataset-", dir=scratch) as tmp:
        extract_dir = Path(tmp) / "archive"
        extract_dir.mkdir()
        # Without a registry the task folders are the archive's: they are parsed as it unpacks.
        with _EarlyParse(dest=extract_dir) as early:
            try:
                root = task_archives.archive_extract(
                    archive,
                    extract_dir,
                    max_member_bytes=settings.SYNTH_TASK_MAX_FILE_BYTES,
                    max_total_bytes=settings.SYNTH_TASK_MAX_ARCHIVE_BYTES,
                    on_member=early.member if registry is None else None,
                )
            except TaskFormatError as exc:
                raise ValidationFailed(str(exc), field="archive") from None
            if registry is None:
                return _dataset_import_task_dirs(
                    org=org, name=name, version=version, root=root, field="archive", early=early
                )
        bases = [extract_dir] if root == extract_dir else [extract_dir, root]
        tasks = _registry_tasks(
            data=registry,
            name=name,
            version=version,
            bases=bases,
            confine_to=extract_dir,
            where="registry.json",
            field="registry",
        )
        return _dataset_version_store(org=org, name=name, version=version, tasks=tasks)


def dataset_version_resolve(*, org: Organization, reference: str, with_local_support: bool = False) -> DatasetVersion:
    """`ORG/NAME@VERSION` -> the caller's dataset version.

    Another organization's reference is "not found", never "forbidden", so that names
    do not leak across tenants. ``with_local_support``: see dataset_version_get (for a
    dataset_version_local_check to follow).
    """
    match = REFERENCE_RE.match(reference or "")
    if not match:
        raise ValidationFailed(f"malformed dataset reference {reference!r}: expected ORG/NAME@VERSION", field="dataset")
    dataset_version = None
    if match["org"] == org.slug:
        dataset_version = dataset_version_get(
            org=org, name=match["name"], version=match["version"], with_local_support=with_local_support
        )
    if dataset_version is None:
        raise NotFound(f"dataset {reference} not found", field="dataset")
    return dataset_version


def dataset_version_local_check(*, dataset_version: DatasetVersion, task_names: list[str] | None = None) -> None:
    """Refuse a run in the local sandbox over a dataset version holding a task it cannot run
    (the verdicts stored at import); with ``task_names`` (the plan's fnmatch patterns) only
    the tasks the run selects count."""
    if getattr(dataset_version, "has_local_unsupported", True) is False:
        return  # resolved with_local_support: no task of it is refused, nothing to read
    unsupported = [
        entry
        for entry in dataset_version_local_unsupported(dataset_version=dataset_version)
        if not task_names or any(fnmatch.fnmatchcase(entry.task_version.name, p) for p in task_names)
    ]
    if not unsupported:
        return
    first = unsupported[0].task_version
    more = f" (and {len(unsupported) - 1} more task(s) of the dataset)" if len(unsupported) > 1 else ""
    raise ValidationFailed(
        f"task {first.name!r} of {dataset_version.reference} cannot run in the local sandbox: "
        f"{'; '.join(first.local_problems)}{more}. Choose another environment (plan.environment: docker, "
        "daytona, modal, ...) or leave the task out (plan.task_names)",
        field="dataset",
    )


def task_version_materialize(*, task_version: TaskVersion, dest: Path | str) -> Path:
    """Unpack a task version's canonical archive into `dest` (a Harbor task folder)."""
    # Imported here: the object store module is completed separately and only this
    # function needs to read from it.
    from apps.objects.services import object_read

    data = object_read(obj=task_version.archive)
    return task_archives.archive_unpack(data, Path(dest))
