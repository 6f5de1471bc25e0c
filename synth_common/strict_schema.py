"""JSON Schema validators whose "integer" is a JSON integer.

JSON Schema's "integer" admits ``2.0``; the platform refuses it with the field's path rather
than normalising it (what is accepted is exactly what is stored), so every validator is built
here. Django-free: the recipe schema (synth_launcher.recipe) and the server's input rules
(apps.core.inputs) both use it.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator, validators


def is_json_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def strict_validator(base: Any = Draft202012Validator, *, keywords: dict[str, Any] | None = None) -> Any:
    """A JSON Schema validator class whose "integer" is a JSON integer (2.0 is not one)."""
    checker = base.TYPE_CHECKER.redefine("integer", lambda _checker, value: is_json_integer(value))
    return validators.extend(base, keywords or {}, type_checker=checker)
