"""Small admin helpers: read-only model admins, paged inlines and links between records."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import Model, QuerySet
from django.forms.models import _get_foreign_key
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html


def admin_link(obj: Model | None, label: str | None = None) -> str:
    if obj is None:
        return "-"
    url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])
    return format_html('<a href="{}">{}</a>', url, label or str(obj))


def changelist_url(*, model: type[Model], **filters: Any) -> str:
    """The admin list of `model`, filtered by field lookups (e.g. run__id__exact=...)."""
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    return f"{url}?{urlencode(filters)}" if filters else url


def changelist_link(*, model: type[Model], label: str, **filters: Any) -> str:
    return format_html('<a href="{}">{}</a>', changelist_url(model=model, **filters), label)


class ReadOnlyAdmin(admin.ModelAdmin):
    """For immutable records: browsable, never editable from the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class PagedInline(ReadOnlyInline):
    """A read-only inline that shows one page of its rows, with links to the other pages
    and to the full list: a run with thousands of trials still has a short page.

    The admin builds inline instances per request, so the page found here is this request's.
    """

    per_page = 20
    template = "admin/edit_inline/paged_tabular.html"
    page: dict[str, Any] | None = None

    def page_param(self) -> str:
        return f"{self.model._meta.model_name}-page"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = super().get_queryset(request)
        match = request.resolver_match
        parent_id = match.kwargs.get("object_id") if match else None
        if parent_id is None:
            return qs
        # The key the inline's formset uses (Django's own lookup: it raises if there is none).
        fk = _get_foreign_key(self.parent_model, self.model, fk_name=self.fk_name)
        if fk is None:
            return qs
        rows = qs.filter(**{fk.name: parent_id})
        total = rows.count()
        pages = max(1, -(-total // self.per_page))
        try:
            number = min(max(1, int(request.GET.get(self.page_param(), "1"))), pages)
        except ValueError:
            number = 1
        start = (number - 1) * self.per_page
        ids = list(rows.values_list("pk", flat=True)[start : start + self.per_page])
        others = {k: v for k, v in request.GET.items() if k != self.page_param()}

        def url(n: int) -> str:
            return "?" + urlencode({**others, self.page_param(): n})

        self.page = {
            "number": number,
            "pages": pages,
            "total": total,
            "first": start + 1 if total else 0,
            "last": start + len(ids),
            "previous_url": url(number - 1) if number > 1 else None,
            "next_url": url(number + 1) if number < pages else None,
            "all_url": changelist_url(model=self.model, **{f"{fk.name}__{fk.target_field.name}__exact": parent_id}),
        }
        # A filter on ids (not a slice): the inline formset filters this queryset again.
        return qs.filter(pk__in=ids)
