from __future__ import annotations

from django.urls import path

from apps.profiles.apis import (
    ProfileDetailApi,
    ProfileListApi,
    ProfileVersionDetailApi,
    ProfileVersionListApi,
    ProfileVersionMetaApi,
)

urlpatterns = [
    path("profiles", ProfileListApi.as_view(), name="profile-list"),
    path("profiles/<str:name>", ProfileDetailApi.as_view(), name="profile-detail"),
    path("profiles/<str:name>/versions", ProfileVersionListApi.as_view(), name="profile-versions"),
    path("profiles/<str:name>/versions/<int:version>", ProfileVersionDetailApi.as_view(), name="profile-version"),
    path(
        "profiles/<str:name>/versions/<int:version>/meta",
        ProfileVersionMetaApi.as_view(),
        name="profile-version-meta",
    ),
]
