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


class ChoiceListField(serializers.CharField):
    """One value or a comma-separated list (``?status=failed,lost``), each one of ``choices``:
    the values, in order. A value no record can hold is the caller's error, not an empty page."""

    default_error_messages = {"invalid_choice": '"{input}" is not one of: {choices}.'}

    def __init__(self, *, choices: list[tuple[str, str]], **kwargs: Any) -> None:
        self.choices = [value for value, _ in choices]
        kwargs.setdefault("help_text", "one or more of " + ", ".join(self.choices) + ", comma-separated")
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> list[str]:  # type: ignore[override]
        values = super().to_internal_value(data).split(",")
        for value in values:
            if value not in self.choices:
                self.fail("invalid_choice", input=value, choices=", ".join(self.choices))
        return values
