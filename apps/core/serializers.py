"""Serializers that document shapes every app shares: the error body and a cursor page.

They describe what the views already write (apps.core.errors.error_body, the paginators'
``{"next", "previous", "results"}``), so drf-spectacular can name them in the schema."""

from __future__ import annotations

from functools import cache

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
