"""Admin for profiles: browse and inspect only. Versions are immutable (a database trigger
refuses UPDATE and DELETE), so the admin offers no way to change or delete one; profiles
are created by publishing, and cannot be deleted while versions (which PROTECT them) exist.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import Count, Max, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from apps.profiles.models import AgentProfile, ProfileVersion
from apps.profiles.selectors import profile_version_bytes


def _recipe(obj: ProfileVersion) -> dict[str, Any]:
    try:
        value = json.loads(profile_version_bytes(profile_version=obj))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class ReadOnlyAdminMixin:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ProfileVersionInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = ProfileVersion
    fields = ("link", "digest", "engine", "model_binding", "created_by", "created_at")
    readonly_fields = fields
    ordering = ("-version",)
    extra = 0
    show_change_link = False

    @admin.display(description="version")
    def link(self, obj: ProfileVersion) -> str:
        url = reverse("admin:profiles_profileversion_change", args=[obj.pk])
        return format_html('<a href="{}">{}</a>', url, obj.version)

    @admin.display(description="engine")
    def engine(self, obj: ProfileVersion) -> str:
        return _engine(obj)

    @admin.display(description="model")
    def model_binding(self, obj: ProfileVersion) -> str:
        return _model(obj)


def _engine(obj: ProfileVersion) -> str:
    engine = _recipe(obj).get("engine") or {}
    return f"{engine.get('name', '?')} {engine.get('version', '')}".strip()


def _model(obj: ProfileVersion) -> str:
    model = _recipe(obj).get("model") or {}
    return ", ".join(f"{key}={value}" for key, value in model.items()) or "-"


@admin.register(AgentProfile)
class AgentProfileAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("name", "org", "latest_version", "versions_count", "created_at", "id")
    list_filter = ("org", "created_at")
    search_fields = ("name", "id", "org__slug")
    list_select_related = ("org",)
    readonly_fields = ("id", "org", "name", "created_at")
    inlines = [ProfileVersionInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[AgentProfile]:
        return super().get_queryset(request).annotate(_latest=Max("versions__version"), _count=Count("versions"))

    @admin.display(description="latest", ordering="_latest")
    def latest_version(self, obj: AgentProfile) -> int | None:
        return obj._latest  # type: ignore[attr-defined]

    @admin.display(description="versions", ordering="_count")
    def versions_count(self, obj: AgentProfile) -> int:
        return obj._count  # type: ignore[attr-defined]


@admin.register(ProfileVersion)
class ProfileVersionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("__str__", "version", "engine", "model_binding", "short_digest", "created_by", "created_at", "id")
    list_filter = ("profile__org", "created_at")
    search_fields = ("id", "digest", "profile__name", "profile__org__slug")
    list_select_related = ("profile__org", "created_by")
    date_hierarchy = "created_at"
    fields = ("id", "profile", "version", "digest", "size", "created_by", "created_at", "recipe")
    readonly_fields = fields

    @admin.display(description="engine")
    def engine(self, obj: ProfileVersion) -> str:
        return _engine(obj)

    @admin.display(description="model")
    def model_binding(self, obj: ProfileVersion) -> str:
        return _model(obj)

    @admin.display(description="digest", ordering="digest")
    def short_digest(self, obj: ProfileVersion) -> str:
        return obj.digest[:12]

    @admin.display(description="canonical bytes")
    def size(self, obj: ProfileVersion) -> int:
        return len(profile_version_bytes(profile_version=obj))

    @admin.display(description="recipe (canonical, shown pretty-printed)")
    def recipe(self, obj: ProfileVersion) -> str:
        data = profile_version_bytes(profile_version=obj)
        try:
            text = json.dumps(json.loads(data), indent=2, sort_keys=True, ensure_ascii=False)
        except ValueError:
            text = data.decode("utf-8", errors="replace")
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', text)
