"""Reads: model routes (and name resolution) and captured interactions."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from django.db.models import QuerySet

from apps.accounts.models import Organization
from apps.core.errors import NotFound
from apps.proxy.models import Interaction, ModelRoute


def route_list(*, inference_only: bool = False) -> QuerySet[ModelRoute]:
    qs = ModelRoute.objects.all().order_by("name")
    if inference_only:
        qs = qs.filter(inference_enabled=True)
    return qs


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def route_resolve(*, name: str) -> ModelRoute | None:
    """The route a model name means: exact route name, then exact alias, then glob alias
    (see `route_match`)."""
    route = ModelRoute.objects.filter(name=name).first()
    if route is not None:
        return route
    return route_match(routes=list(ModelRoute.objects.all().order_by("name")), name=name)


def route_match(*, routes: Sequence[ModelRoute], name: str) -> ModelRoute | None:
    """`route_resolve` over routes already read (ordered by name), with no query.

    Names compare case-sensitively except aliases, which Claude Code may send in any case
    ("Sonnet", "claude-sonnet-4-5"). Among several matching globs the longest pattern
    (the most specific) wins, then the route name, so resolution is deterministic.
    """
    for route in routes:
        if route.name == name:
            return route
    lowered = name.lower()
    for route in routes:
        for alias in route.aliases or []:
            if isinstance(alias, str) and not _is_glob(alias) and alias.lower() == lowered:
                return route
    best: tuple[int, str, ModelRoute] | None = None
    for route in routes:
        for alias in route.aliases or []:
            if isinstance(alias, str) and _is_glob(alias) and fnmatch.fnmatchcase(lowered, alias.lower()):
                rank = (-len(alias), route.name, route)
                if best is None or rank[:2] < best[:2]:
                    best = rank
    return best[2] if best else None


def interaction_list(
    *, org: Organization, run_id: str | None = None, trial_id: str | None = None
) -> QuerySet[Interaction]:
    qs = Interaction.objects.filter(org=org).select_related("route").defer("payload", "prompt_ids_packed")
    if run_id:
        qs = qs.filter(run_id=run_id)
    if trial_id:
        qs = qs.filter(trial_id=trial_id)
    return qs


def interaction_get(*, org: Organization, interaction_id: str) -> Interaction:
    """One of the org's interactions; another org's is indistinguishable from none (404)."""
    interaction = Interaction.objects.filter(org=org, id=interaction_id).select_related("route").first()
    if interaction is None:
        raise NotFound(f"no interaction {interaction_id}")
    return interaction
