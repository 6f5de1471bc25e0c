"""Cursor paging for every list: `?cursor=` in, `next` out, stable under inserts."""

from __future__ import annotations

from rest_framework.pagination import CursorPagination


class IdCursorPagination(CursorPagination):
    ordering = "-id"  # ids are time-ordered, so newest first
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500


class OldestFirstPagination(IdCursorPagination):
    ordering = "id"
