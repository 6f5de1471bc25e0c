"""The local sandbox's verdict on each task, made at import: `dataset push` reports the tasks
it cannot run (naming the instruction) without refusing them, and a run in the local sandbox
over such a dataset is refused at submission, before any trial exists."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from apps.datasets.models import TaskVersion
from apps.runs.models import Run, Trial
from tests.datasets.conftest import EXAMPLE_SLUGS, tar_gz, write_task

pytestmark = pytest.mark.django_db


def _push(member, archive: io.BytesIO, *, name: str = "mixed", version: str = "1"):
    return member.client.post(
        "/api/datasets", {"name": name, "version": version, "archive": archive}, format="multipart"
    )


@pytest.fixture
def mixed_tasks(tmp_path: Path) -> Path:
    """Two tasks the local sandbox runs and one whose Dockerfile it cannot apply."""
    root = tmp_path / "tasks"
    write_task(root, "fine")
    copying = write_task(root, "copying")
    (copying / "environment" / "data.txt").write_text("input\n")
    (copying / "environment" / "Dockerfile").write_text(
        "FROM python:3.12-slim\nWORKDIR /app\nCOPY data.txt /app/data.txt\nRUN python3 -c 'print(1)'\n"
    )
    other_user = write_task(root, "other-user")
    (other_user / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\nRUN true\nUSER app\n")
    return root


def _submit(member, dataset: str, actor, **plan):  # type: ignore[no-untyped-def]
    body = {
        "kind": "evaluate",
        "dataset": dataset,
        "actor": {"profile": actor.profile.name, "version": actor.version},
        "judge": None,
        "plan": plan,
    }
    return member.client.post("/api/runs", body, format="json")


def test_push_reports_the_tasks_the_local_sandbox_cannot_run(alice, mixed_tasks: Path) -> None:
    response = _push(alice, tar_gz(mixed_tasks))
    assert response.status_code == 201, response.json()  # imported all the same
    body = response.json()
    assert body["task_count"] == 3
    verdict = body["local_sandbox"]
    assert verdict["unsupported_count"] == 1
    [task] = verdict["unsupported"]
    assert task["name"] == "test/other-user" and task["position"] == 2
    assert task["problems"] == [
        "environment/Dockerfile line 4 (USER app): only root can be the user (the sandbox maps a single uid, "
        "so the permissions of 'app' cannot be reproduced)"
    ]
    # Stored with the task version (admission reads it without unpacking anything).
    stored = TaskVersion.objects.get(pk=task["task_version_id"])
    assert stored.local_support["supported"] is False and stored.local_problems == task["problems"]
    assert TaskVersion.objects.get(name="test/copying").local_support["supported"] is True
    detail = alice.client.get(f"/api/tasks/{task['task_version_id']}").json()
    assert detail["local_sandbox"]["problems"] == task["problems"]
    shown = alice.client.get("/api/datasets/team/mixed@1").json()
    assert shown["local_sandbox"] == verdict


def test_the_example_tasks_all_run_in_the_local_sandbox(alice, examples_copy) -> None:
    body = _push(alice, tar_gz(examples_copy(1)), name="examples").json()
    assert body["task_count"] == len(EXAMPLE_SLUGS)
    assert body["local_sandbox"] == {"unsupported_count": 0, "unsupported": []}


def test_a_local_run_over_such_a_dataset_is_refused_at_submission(alice, mixed_tasks: Path) -> None:
    from tests.factories import make_profile_version

    actor = make_profile_version(org=alice.org)
    reference = _push(alice, tar_gz(mixed_tasks)).json()["reference"]

    for plan in (
        {},
        {"environment": "local"},
        {"environment": "synth_sandbox.environment:LocalSandboxEnvironment"},
    ):
        response = _submit(alice, reference, actor, **plan)
        assert response.status_code == 400, response.json()
        error = response.json()["error"]
        assert error["type"] == "invalid_request" and error["field"] == "dataset"
        assert error["message"].startswith(
            "task 'test/other-user' of team/mixed@1 cannot run in the local sandbox: "
            "environment/Dockerfile line 4 (USER app): only root can be the user"
        )
    assert not Run.objects.filter(org=alice.org).exists() and not Trial.objects.filter(run__org=alice.org).exists()

    # Another environment may run it; a plan that leaves the task out runs locally.
    assert _submit(alice, reference, actor, environment="docker").status_code == 201
    assert _submit(alice, reference, actor, task_names=["test/fine", "test/copying"]).status_code == 201
    refused = _submit(alice, reference, actor, task_names=["test/*"])
    assert refused.status_code == 400 and "test/other-user" in refused.json()["error"]["message"]
