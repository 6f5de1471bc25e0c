"""Model routes: the embedded default, validated writes, and what a caller may list.

A route names the adapter family, tokenizer, context window, max output and sampler
backend of one served model (apps.proxy.models.ModelRoute). Writes come from
`manage.py route_add`, the admin and tests; resolution by name or alias is in selectors.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from apps.core.errors import ValidationFailed
from apps.proxy.credentials import Caller
from apps.proxy.models import ModelRoute

# The embedded default: Qwen3's chat format and real vocabulary, sampled by the tiny
# random-weight local model (gibberish text, real token plumbing), trainable locally.
# Claude Code's own model names and aliases all map to it.
DEFAULT_ROUTE: dict[str, Any] = {
    "name": "qwen3-8b",
    "family": "qwen3",
    "tokenizer": "qwen3",
    "context_window": 32768,
    "max_output": 8192,
    "sampler_backend": "local",
    "sampler_config": {"family": "qwen3", "tiny": True, "seed": 0},
    "trainable": True,
    "inference_enabled": True,
    "aliases": ["claude-*", "sonnet", "opus", "haiku", "default"],
}


def route_family_check(*, family: str) -> None:
    """Refuse a family no adapter renders: a route naming one would fail every call."""
    from apps.proxy.adapters.registry import ADAPTERS

    if family not in ADAPTERS:
        raise ValidationFailed(
            f"unknown family {family!r}; known families: {', '.join(sorted(ADAPTERS))}", field="family"
        )


def route_upsert(
    *,
    name: str,
    family: str,
    tokenizer: str,
    context_window: int,
    max_output: int,
    sampler_backend: str,
    sampler_config: dict[str, Any] | None = None,
    trainable: bool = False,
    inference_enabled: bool = True,
    aliases: list[str] | None = None,
) -> tuple[ModelRoute, bool]:
    """Create or update a route by name. Returns (route, created)."""
    from apps.proxy.samplers.factory import BACKENDS

    if not name or len(name) > 100:
        raise ValidationFailed("name must be 1 to 100 characters", field="name")
    route_family_check(family=family)
    if sampler_backend not in BACKENDS:
        raise ValidationFailed(f"sampler_backend must be one of {', '.join(BACKENDS)}", field="sampler_backend")
    if max_output <= 0 or context_window <= max_output:
        raise ValidationFailed("need 0 < max_output < context_window", field="context_window")
    aliases = list(aliases or [])
    if not all(isinstance(a, str) and a for a in aliases):
        raise ValidationFailed("aliases must be non-empty strings", field="aliases")
    if not isinstance(sampler_config or {}, dict):
        raise ValidationFailed("sampler_config must be an object", field="sampler_config")
    return ModelRoute.objects.update_or_create(
        name=name,
        defaults={
            "family": family,
            "tokenizer": tokenizer,
            "context_window": context_window,
            "max_output": max_output,
            "sampler_backend": sampler_backend,
            "sampler_config": sampler_config or {},
            "trainable": trainable,
            "inference_enabled": inference_enabled,
            "aliases": aliases,
        },
    )


def routes_for_caller(*, caller: Caller, routes: Sequence[ModelRoute] | None = None) -> list[ModelRoute]:
    """What GET /v1/models lists: the credential's route, or every inference route (by name).

    `routes`: every route, ordered by name, as the proxy's route cache holds them
    (apps.proxy.lookups); without them they are read here."""
    if routes is None:
        routes = list(ModelRoute.objects.all().order_by("name"))
    if caller.credential is not None:
        return [r for r in routes if r.name == caller.credential.route and r.inference_enabled]
    return [r for r in routes if r.inference_enabled]
