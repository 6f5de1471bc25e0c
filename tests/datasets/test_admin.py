"""The admin shows every dataset model, read-only, with the ordered tasks inline."""

from __future__ import annotations

import pytest
from django.urls import reverse

from apps.datasets.models import Dataset, DatasetVersion, DatasetVersionTask, TaskVersion
from apps.datasets.services import dataset_import_dir

pytestmark = pytest.mark.django_db


def test_admin_pages_render_read_only(admin_client, alice, examples_copy) -> None:
    dv, _ = dataset_import_dir(org=alice.org, name="examples", version="1.0", path=examples_copy(1))
    entry = DatasetVersionTask.objects.filter(dataset_version=dv).first()
    for model, obj in (
        (TaskVersion, entry.task_version),
        (Dataset, dv.dataset),
        (DatasetVersion, dv),
        (DatasetVersionTask, entry),
    ):
        name = model._meta.model_name
        changelist = admin_client.get(reverse(f"admin:datasets_{name}_changelist"))
        assert changelist.status_code == 200, name
        change = admin_client.get(reverse(f"admin:datasets_{name}_change", args=[obj.pk]))
        assert change.status_code == 200, name
        assert admin_client.get(reverse(f"admin:datasets_{name}_add")).status_code == 403
    page = admin_client.get(reverse("admin:datasets_datasetversion_change", args=[dv.pk])).content.decode()
    # The inline lists the ordered tasks with links to each task version.
    assert reverse("admin:datasets_taskversion_change", args=[entry.task_version_id]) in page
    assert "synth-examples/count-primes-memory" in page
    search = admin_client.get(reverse("admin:datasets_taskversion_changelist"), {"q": "roman"})
    assert "implement-roman" in search.content.decode()
