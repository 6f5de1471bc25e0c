from __future__ import annotations

from django.urls import path, re_path

from apps.datasets.apis import DatasetListCreateApi, DatasetVersionDetailApi, TaskVersionDetailApi

urlpatterns = [
    path("datasets", DatasetListCreateApi.as_view(), name="dataset-list"),
    # NAME cannot hold "@" or "/", VERSION cannot hold "/": the split is unambiguous.
    re_path(
        r"^datasets/(?P<org>[^/]+)/(?P<name>[^/@]+)@(?P<version>[^/]+)$",
        DatasetVersionDetailApi.as_view(),
        name="dataset-version-detail",
    ),
    path("tasks/<str:task_version_id>", TaskVersionDetailApi.as_view(), name="task-version-detail"),
]
