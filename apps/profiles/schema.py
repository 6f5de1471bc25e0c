"""The agent recipe as the API checks it: synth_launcher.recipe's schema and rules, whose
RecipeInvalid becomes ValidationFailed (a 400 naming the field). The schema, the engines and
the reserved names live in the Django-free launcher, which checks every recipe it launches
with the same code."""

from __future__ import annotations

from typing import Any

from apps.core.errors import ValidationFailed
from synth_launcher import recipe as _recipe
from synth_launcher.recipe import (
    BINDING_NAMESPACES,
    ENGINES,
    ENGINES_NEEDING_MODEL,
    MAX_RECIPE_BYTES,
    RECIPE_SCHEMA,
    json_path,
)

__all__ = [
    "BINDING_NAMESPACES",
    "ENGINES",
    "ENGINES_NEEDING_MODEL",
    "MAX_RECIPE_BYTES",
    "RECIPE_SCHEMA",
    "json_path",
    "recipe_validate",
]


def recipe_validate(*, recipe: Any) -> None:
    """Raise ValidationFailed (400) naming the first offending JSON path, or return."""
    try:
        _recipe.recipe_validate(recipe=recipe)
    except _recipe.RecipeInvalid as exc:
        raise ValidationFailed(exc.message, field=exc.field) from None
