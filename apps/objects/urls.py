from __future__ import annotations

from django.urls import path, re_path

from apps.objects.apis import (
    ObjectCommitApi,
    ObjectContentApi,
    ObjectDetailApi,
    ObjectUploadGrantApi,
    ObjectUploadReceiveApi,
)

app_name = "objects"

urlpatterns = [
    path("objects/uploads", ObjectUploadGrantApi.as_view(), name="upload-grant"),
    path("objects/uploads/<str:grant_id>", ObjectUploadReceiveApi.as_view(), name="upload-receive"),
    path("objects/uploads/<str:grant_id>/commit", ObjectCommitApi.as_view(), name="commit"),
    re_path(r"^objects/(?P<sha256>[0-9a-fA-F]{64})$", ObjectDetailApi.as_view(), name="detail"),
    re_path(r"^objects/(?P<sha256>[0-9a-f]{64})/content$", ObjectContentApi.as_view(), name="content"),
]
