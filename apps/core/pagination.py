"""Cursor paging for every list: `?cursor=` in, `next` out, stable under inserts."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request

from apps.core.inputs import query_int, text_problem


class IdCursorPagination(CursorPagination):
    ordering = "-id"  # ids are time-ordered, so newest first
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int:
        # DRF falls back to the default for "2.0", "0" or "-1"; a wrong limit is the caller's error.
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None or raw == "":
            return self.page_size
        return min(query_int(raw, name=self.page_size_query_param, minimum=1), self.max_page_size)

    def decode_cursor(self, request: Request) -> Any:
        cursor = super().decode_cursor(request)
        # The position is compared with ids in SQL, where a NUL is an error, not "no match".
        if cursor is not None and cursor.position is not None and text_problem(str(cursor.position)):
            raise NotFound(self.invalid_cursor_message)
        return cursor


class OldestFirstPagination(IdCursorPagination):
    ordering = "id"
