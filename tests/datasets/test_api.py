"""REST: POST /api/datasets, GET /api/datasets[/org/name@version], GET /api/tasks/<id>."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from apps.datasets.models import Dataset, DatasetVersion, TaskVersion
from apps.objects.models import StoredObject
from tests.datasets.conftest import EXAMPLE_SLUGS, EXAMPLES, TASK_TOML, tar_gz, write_task

pytestmark = pytest.mark.django_db


def _post(member, archive: io.BytesIO, *, name: str = "examples", version: str = "1.0", registry: bytes | None = None):
    data: dict[str, object] = {"name": name, "version": version, "archive": archive}
    if registry is not None:
        registry_file = io.BytesIO(registry)
        registry_file.name = "registry.json"
        data["registry"] = registry_file
    return member.client.post("/api/datasets", data, format="multipart")


def test_upload_archive_created_then_same_then_conflict(alice, examples_copy) -> None:
    first = _post(alice, tar_gz(examples_copy(1)))
    assert first.status_code == 201, first.json()
    body = first.json()
    assert body["id"].startswith("dsv_")
    assert body["reference"] == "team/examples@1.0"
    assert body["task_count"] == len(EXAMPLE_SLUGS)
    assert [t["position"] for t in body["tasks"]] == list(range(len(EXAMPLE_SLUGS)))
    assert [t["name"] for t in body["tasks"]] == [f"synth-examples/{s}" for s in EXAMPLE_SLUGS]
    assert all(t["task_version_id"].startswith("tv_") and len(t["digest"]) == 64 for t in body["tasks"])
    assert body["next"] is None

    # Same content, other mtimes, wrapped in a top-level folder: the same version.
    again = _post(alice, tar_gz(examples_copy(2), arcname="examples"))
    assert again.status_code == 200, again.json()
    assert again.json()["id"] == body["id"] and again.json()["digest"] == body["digest"]

    changed = examples_copy(3)
    (changed / "implement-roman" / "instruction.md").write_text("Implement roman numerals.\n")
    conflict = _post(alice, tar_gz(changed))
    assert conflict.status_code == 409
    error = conflict.json()["error"]
    assert error["type"] == "conflict" and error["field"] == "version"
    assert "team/examples@1.0 already exists with different content" in error["message"]


def test_upload_with_registry(alice, examples_copy) -> None:
    response = _post(alice, tar_gz(examples_copy(1).parent), registry=(EXAMPLES / "registry.json").read_bytes())
    assert response.status_code == 201, response.json()
    assert response.json()["task_count"] == len(EXAMPLE_SLUGS)


def test_malformed_upload_names_the_file_and_stores_nothing(alice, tmp_path: Path) -> None:
    write_task(tmp_path, "good")
    broken = write_task(tmp_path, "hello")
    (broken / "tests" / "test.sh").unlink()
    counts = [m.objects.count() for m in (TaskVersion, Dataset, DatasetVersion, StoredObject)]
    response = _post(alice, tar_gz(tmp_path))
    assert response.status_code == 400
    assert response.json()["error"] == {
        "type": "invalid_request",
        "message": "hello/tests/test.sh: missing",
        "field": "archive",
    }
    assert [m.objects.count() for m in (TaskVersion, Dataset, DatasetVersion, StoredObject)] == counts


def test_upload_validation(alice, tmp_path: Path) -> None:
    missing = alice.client.post("/api/datasets", {"name": "x", "version": "1"}, format="multipart")
    assert missing.status_code == 400 and missing.json()["error"]["field"] == "archive"
    garbage = io.BytesIO(b"definitely not a tarball" * 10)
    garbage.name = "x.tgz"
    response = _post(alice, garbage)
    assert response.status_code == 400
    assert "not a readable tar or tar.gz file" in response.json()["error"]["message"]
    write_task(tmp_path, "hello")
    bad_name = _post(alice, tar_gz(tmp_path), name="no spaces please")
    assert bad_name.status_code == 400 and bad_name.json()["error"]["field"] == "name"


def test_upload_size_limit(alice, tmp_path: Path, settings) -> None:
    settings.SYNTH_TASK_MAX_FILE_BYTES = 1024
    task = write_task(tmp_path, "hello")
    (task / "environment" / "big.bin").write_bytes(b"x" * 4096)
    response = _post(alice, tar_gz(tmp_path))
    assert response.status_code == 400
    assert "big.bin: file is 4096 bytes, over the limit of 1024 bytes" in response.json()["error"]["message"]


def test_tasks_are_paged_in_order(alice, examples_copy) -> None:
    assert _post(alice, tar_gz(examples_copy(1))).status_code == 201
    url: str | None = "/api/datasets/team/examples@1.0?limit=4"
    positions, names = [], []
    pages = 0
    while url:
        response = alice.client.get(url)
        assert response.status_code == 200, response.json()
        body = response.json()
        assert body["task_count"] == len(EXAMPLE_SLUGS)
        positions += [t["position"] for t in body["tasks"]]
        names += [t["name"] for t in body["tasks"]]
        url = body["next"]
        pages += 1
    assert pages == 2
    assert positions == list(range(len(EXAMPLE_SLUGS)))
    assert names == [f"synth-examples/{s}" for s in EXAMPLE_SLUGS]
    assert alice.client.get("/api/datasets/team/examples@1.0?cursor=-1").status_code == 400
    assert alice.client.get("/api/datasets/team/examples@1.0?cursor=abc").json()["error"]["field"] == "cursor"
    assert alice.client.get("/api/datasets/team/examples@1.0?cursor=99").json()["tasks"] == []


def test_list_datasets(alice, bob, examples_copy) -> None:
    assert _post(alice, tar_gz(examples_copy(1))).status_code == 201
    assert _post(alice, tar_gz(examples_copy(2)), version="1.1").status_code == 201
    body = alice.client.get("/api/datasets").json()
    assert [r["reference"] for r in body["results"]] == ["team/examples@1.1", "team/examples@1.0"]
    assert "next" in body
    assert bob.client.get("/api/datasets").json()["results"] == []


def test_task_detail(alice, examples_copy) -> None:
    tasks = _post(alice, tar_gz(examples_copy(1))).json()["tasks"]
    entry = next(t for t in tasks if t["name"].endswith("count-primes-memory"))
    response = alice.client.get(f"/api/tasks/{entry['task_version_id']}")
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == entry["task_version_id"] and body["digest"] == entry["digest"]
    assert body["resources"] == {"cpus": 1.0, "memory_mb": 3072, "storage_mb": 4096, "gpus": None}
    assert body["timeouts"] == {"agent_sec": 900.0, "verifier_sec": 120.0, "build_sec": 600.0}
    assert body["archive"]["sha256"] == body["digest"] and body["archive"]["size"] > 0
    assert body["environment"]["workdir"] == "/app" and body["environment"]["has_dockerfile"] is True
    assert body["config"]["task"]["name"] == "synth-examples/count-primes-memory"
    assert "200,000,000" in body["instruction"]
    assert alice.client.get("/api/tasks/tv_doesnotexist").status_code == 404


def test_tenant_isolation(alice, bob, examples_copy) -> None:
    body = _post(alice, tar_gz(examples_copy(1))).json()
    task_id = body["tasks"][0]["task_version_id"]
    for url in ("/api/datasets/team/examples@1.0", "/api/datasets/rival/examples@1.0", f"/api/tasks/{task_id}"):
        response = bob.client.get(url)
        assert response.status_code == 404, url
        assert response.json()["error"]["type"] == "not_found"
    # Alice cannot address her dataset under another org's slug either.
    assert alice.client.get("/api/datasets/rival/examples@1.0").status_code == 404


def test_viewer_reads_but_cannot_import(alice, viewer, examples_copy) -> None:
    assert _post(alice, tar_gz(examples_copy(1))).status_code == 201
    response = _post(viewer, tar_gz(examples_copy(2)), version="2.0")
    assert response.status_code == 403
    assert response.json()["error"]["type"] == "permission_denied"
    assert not DatasetVersion.objects.filter(version="2.0").exists()
    assert viewer.client.get("/api/datasets/team/examples@1.0").status_code == 200


def test_anonymous_is_refused(client) -> None:
    assert client.get("/api/datasets").status_code in (401, 403)


# REFUSED AT PUSH, NAMING THE FIELD
# ------------------------------------------------------------------------------


def _refusal(response) -> dict:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["type"] == "invalid_request" and error["field"] == "archive"
    return error


def test_a_member_name_that_is_not_utf8_is_refused(alice, tmp_path: Path) -> None:
    write_task(tmp_path, "good")
    buf = io.BytesIO()
    # GNU headers carry the raw bytes; tarfile reads them back as lone surrogates.
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT, errors="surrogateescape") as tar:
        tar.add(tmp_path / "good", arcname="good")
        info = tarfile.TarInfo("good/caf\udce9.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    buf.seek(0)
    buf.name = "tasks.tar.gz"
    counts = [m.objects.count() for m in (TaskVersion, DatasetVersion)]
    error = _refusal(_post(alice, buf))
    assert error["message"] == "archive: good/caf\\xe9.txt: file name is not valid UTF-8"
    assert [m.objects.count() for m in (TaskVersion, DatasetVersion)] == counts


@pytest.mark.parametrize(
    "old, new, fragment",
    [
        ("memory_mb = 1024", "memory_mb = -1", "line 14: [environment].memory_mb: must be positive (got -1)"),
        ("memory_mb = 1024", "memory_mb = 3000000000", "[environment].memory_mb: must be at most 2147483647"),
        ("cpus = 1", "cpus = 0", "line 13: [environment].cpus: must be positive (got 0)"),
        ("cpus = 1", "storage_mb = 0", "[environment].storage_mb: must be positive (got 0)"),
        ("cpus = 1", "build_timeout_sec = -1.0", "[environment].build_timeout_sec: must be positive (got -1.0)"),
        ("cpus = 1", "gpus = -1", "[environment].gpus: must not be negative (got -1)"),
        ("timeout_sec = 120.0", "timeout_sec = -5.0", "line 10: [agent].timeout_sec: must be positive (got -5.0)"),
        ("timeout_sec = 60.0", "timeout_sec = 0.0", "line 7: [verifier].timeout_sec: must be positive (got 0.0)"),
        ("timeout_sec = 120.0", "timeout_sec = inf", "[agent].timeout_sec: must be a finite number (got inf)"),
        ('workdir = "/app"', 'workdir = "/app"\n[metadata]\nscore = nan', "[metadata].score: must be a finite number"),
    ],
)
def test_impossible_resources_and_timeouts_are_refused(alice, tmp_path: Path, old, new, fragment) -> None:
    toml = TASK_TOML.format(slug="hello")
    assert toml.count(old) == 1
    write_task(tmp_path, "hello", toml=toml.replace(old, new))
    error = _refusal(_post(alice, tar_gz(tmp_path)))
    assert error["message"].startswith("hello/task.toml: "), error
    assert fragment in error["message"], error
    assert not TaskVersion.objects.exists()


def test_duplicate_task_names_in_one_dataset_are_refused(alice, tmp_path: Path) -> None:
    write_task(tmp_path, "first", toml=TASK_TOML.format(slug="same"))
    write_task(tmp_path, "second", toml=TASK_TOML.format(slug="same"))
    error = _refusal(_post(alice, tar_gz(tmp_path)))
    assert error["message"] == (
        "second: task name 'test/same' is also the name of first; task names must be unique within a dataset version"
    )
    assert not DatasetVersion.objects.exists()


def test_an_overlong_docker_image_is_refused(alice, tmp_path: Path) -> None:
    write_task(tmp_path, "hello", toml=TASK_TOML.format(slug="hello") + f'docker_image = "{"x" * 301}"\n')
    error = _refusal(_post(alice, tar_gz(tmp_path)))
    assert error["message"] == "hello/task.toml: [environment].docker_image is longer than 300 characters"
