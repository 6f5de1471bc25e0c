from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from apps.accounts.models import ApiToken, Membership, Organization, WorkerIdentity


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "id", "created_at"]
    search_fields = ["slug", "name", "id"]
    readonly_fields = ["id", "created_at"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "org", "role", "created_at"]
    list_filter = ["role", "org"]
    search_fields = ["user__username", "org__slug"]
    autocomplete_fields = ["user", "org"]


@admin.register(WorkerIdentity)
class WorkerIdentityAdmin(admin.ModelAdmin):
    list_display = ["name", "org", "id", "created_at", "disabled_at"]
    list_filter = ["org"]
    search_fields = ["name", "id"]
    readonly_fields = ["id", "created_at"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are issued by `manage.py create_token` (the secret is shown once there);
    the admin can only inspect and revoke them."""

    list_display = [
        "prefix",
        "name",
        "org",
        "user",
        "worker",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
    ]
    list_filter = ["org", "revoked_at"]
    search_fields = ["prefix", "name", "user__username", "worker__name"]
    readonly_fields = [f.name for f in ApiToken._meta.fields if f.name not in ("revoked_at", "expires_at", "name")]
    exclude = ["token_hash"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
