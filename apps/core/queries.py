"""Query strings hold only the parameters a view declares.

A misspelt filter (``?stauts=failed``) used to answer an unfiltered page and a value no
record can hold (``?status=runing``) an empty one, both 200: a caller could not tell a typo
from "nothing matches". Each view that reads its query string now reads it through a
``QuerySerializer`` (apps.core.serializers.ClosedSerializer), which refuses any other name
with a 400 that names it and lists the ones the endpoint takes (as Stripe's API refuses an
unknown parameter).
"""

from __future__ import annotations

from typing import Any, ClassVar

from rest_framework.request import Request
from rest_framework.settings import api_settings

from apps.core.serializers import ClosedSerializer

PAGING = ("cursor", "limit")  # the cursor paginators' own parameters (apps.core.pagination)


class QuerySerializer(ClosedSerializer):
    """A view's query parameters: its fields, plus the paging ones unless ``paged`` is False.
    DRF's format override (``?format=``) is always allowed, as DRF reads it itself."""

    what = "query parameter"
    paged: ClassVar[bool] = True

    def extra_names(self) -> tuple[str, ...]:
        return PAGING if self.paged else ()

    def ignored(self, name: str) -> bool:
        return name == api_settings.URL_FORMAT_OVERRIDE


class PageQuery(QuerySerializer):
    """A paged list without filters: only ``cursor`` and ``limit``."""


def query_read(*, request: Request, serializer: type[QuerySerializer]) -> dict[str, Any]:
    """The request's query parameters, validated by ``serializer`` (a 400 naming the first bad one)."""
    query = serializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    return dict(query.validated_data)
