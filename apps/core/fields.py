"""Serializer fields with the platform's input rules (apps.core.inputs)."""

from __future__ import annotations

from typing import Any

from django.http import QueryDict
from rest_framework import serializers

from apps.core.inputs import is_json_integer, query_digits


class IntegerField(serializers.IntegerField):
    """An integer, strictly: a JSON integer in a JSON body, decimal digits in a query string or
    form. DRF's own field also takes 2.0, "2.0" and "2", which a pinned value must not be."""

    default_error_messages = {"invalid": 'A valid integer is required (a JSON integer such as 2, not 2.0 or "2").'}

    def to_internal_value(self, data: Any) -> int:
        if is_json_integer(data):
            value = int(data)
        elif isinstance(data, str) and isinstance(getattr(self.root, "initial_data", None), QueryDict):
            if not query_digits(data):
                self.fail("invalid")
            value = int(data)
        else:
            self.fail("invalid")
        return value  # min_value / max_value are checked by the field's validators
