"""Serializers every app shares: the error body and a cursor page, which describe what the
views already write (apps.core.errors.error_body, the paginators' ``{"next", "previous",
"results"}``) so that drf-spectacular can name them in the schema; and ClosedSerializer, the
base of inputs that take only the names they declare."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any, ClassVar

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers


class ErrorDetailSerializer(serializers.Serializer):
    class Meta:
        ref_name = "ErrorDetail"

    type = serializers.CharField(help_text="e.g. invalid_request, not_found, conflict")
    message = serializers.CharField()
    field = serializers.CharField(allow_null=True, help_text="path of the offending input, e.g. plan.steps")


class ErrorSerializer(serializers.Serializer):
    """Every 4xx and 5xx answer of /api."""

    class Meta:
        ref_name = "Error"

    error = ErrorDetailSerializer()


class ClosedSerializer(serializers.Serializer):
    """An input that holds only its declared fields (and ``extra_names``): any other name is
    a 400 that names it and lists what the endpoint takes, never silently dropped (a misspelt
    filter would answer an unfiltered page, a cancel's unread field would be lost)."""

    what: ClassVar[str] = "field"

    def extra_names(self) -> tuple[str, ...]:
        """Names taken besides the fields (read elsewhere, e.g. by a paginator)."""
        return ()

    def ignored(self, name: str) -> bool:
        """Names accepted without being listed (read by the framework itself)."""
        return False

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            takes = {*self.fields, *self.extra_names()}
            unknown = sorted(name for name in data if name not in takes and not self.ignored(name))
            if unknown:
                listed = ", ".join(sorted(takes)) or "nothing"
                raise serializers.ValidationError({unknown[0]: [f"unknown {self.what}; this endpoint takes {listed}"]})
        return super().to_internal_value(data)


# The answers every endpoint may give besides its own: bad input, no or a bad token, a role
# that may not, and a missing (or another organization's) record.
ERRORS = {400: ErrorSerializer, 401: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer}


@cache
def paged(item: type[serializers.Serializer], *, name: str) -> type[serializers.Serializer]:
    """A cursor page of ``item`` (IdCursorPagination's answer), as the component ``Paged<name>``."""

    @extend_schema_serializer(component_name=f"Paged{name}")
    class PageSerializer(serializers.Serializer):
        next = serializers.URLField(allow_null=True, help_text="the next page, or null")
        previous = serializers.URLField(allow_null=True, help_text="the previous page, or null")
        results = item(many=True)

    PageSerializer.__name__ = f"Paged{name}Serializer"
    return PageSerializer
