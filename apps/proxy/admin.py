from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.template.loader import render_to_string

from apps.accounts.models import ModelCredential
from apps.core.admin_utils import ReadOnlyAdmin
from apps.core.errors import ValidationFailed
from apps.proxy.admin_selectors import interaction_decode
from apps.proxy.models import HarnessCheck, Interaction, ModelRoute
from apps.proxy.routes import route_family_check


class ModelRouteForm(forms.ModelForm):
    """The admin builds the fields (ModelAdmin.get_form); this adds the family check."""

    def clean_family(self) -> str:
        family = self.cleaned_data["family"]
        try:
            route_family_check(family=family)
        except ValidationFailed as exc:
            raise forms.ValidationError(exc.message) from exc
        return family


@admin.register(ModelRoute)
class ModelRouteAdmin(admin.ModelAdmin):
    form = ModelRouteForm
    list_display = [
        "name",
        "family",
        "tokenizer",
        "context_window",
        "max_output",
        "sampler_backend",
        "trainable",
        "inference_enabled",
    ]
    list_filter = ["family", "sampler_backend", "trainable", "inference_enabled"]
    search_fields = ["name", "family"]
    readonly_fields = ["id", "created_at", "updated_at"]


@admin.register(Interaction)
class InteractionAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "org",
        "route",
        "protocol",
        "run_id",
        "trial_id",
        "agent_id",
        "stop_reason",
        "prompt_tokens",
        "output_tokens",
        "delivery",
        "integrity",
        "eligibility",
        "created_at",
    ]
    list_filter = ["delivery", "integrity", "eligibility", "protocol", "route"]
    search_fields = ["id", "run_id", "trial_id", "session_id", "correlation_id"]
    # The staged payload can be megabytes of ids: never render it in the admin; the page
    # shows a bounded decoding of it instead.
    exclude = ["payload", "prompt_ids_packed"]
    readonly_fields = ["conversation"]

    @admin.display(description="prompt and completion")
    def conversation(self, interaction: Interaction) -> str:
        return render_to_string(
            "admin/proxy/interaction/conversation.html", {"decoded": interaction_decode(interaction=interaction)}
        )

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("org", "route").defer("payload", "prompt_ids_packed")


@admin.register(HarnessCheck)
class HarnessCheckAdmin(ReadOnlyAdmin):
    """Checks of harness builds (manage.py harness_check): recorded by the command only."""

    list_display = ["id", "engine", "harness_version", "digest", "family", "passed", "created_at"]
    list_filter = ["engine", "passed"]
    search_fields = ["id", "digest"]


# Model credentials live in accounts (accounts must not depend on the proxy); they are
# browsed and revoked from here, next to the calls they made.
@admin.register(ModelCredential)
class ModelCredentialAdmin(admin.ModelAdmin):
    list_display = ["prefix", "org", "run_id", "trial_id", "route", "snapshot", "expires_at", "revoked_at"]
    list_filter = ["route"]
    search_fields = ["prefix", "run_id", "trial_id"]
    readonly_fields = [f.name for f in ModelCredential._meta.fields if f.name != "revoked_at"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # issued by the platform for an attempt, never by hand
