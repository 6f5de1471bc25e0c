"""Read-only admin: rows here mirror verified bytes in the store, so editing them would lie."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from apps.objects.models import StoredObject, UploadGrant


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(StoredObject)
class StoredObjectAdmin(ReadOnlyAdmin):
    list_display = ("id", "org", "sha256", "size", "content_type", "committed_at")
    list_filter = ("org", "content_type", "committed_at")
    list_select_related = ("org",)
    search_fields = ("sha256", "id")
    date_hierarchy = "committed_at"
    ordering = ("-committed_at",)


@admin.register(UploadGrant)
class UploadGrantAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "org",
        "sha256",
        "size",
        "content_type",
        "created_at",
        "expires_at",
        "uploaded_at",
        "committed_at",
    )
    list_filter = ("org", ("uploaded_at", admin.EmptyFieldListFilter), ("committed_at", admin.EmptyFieldListFilter))
    list_select_related = ("org",)
    search_fields = ("sha256", "id")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
