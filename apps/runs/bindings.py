"""Model bindings: what a recipe's ``model`` becomes when a run pins it.

``{"route": "qwen3-8b"}`` stays as it is. ``{"checkpoint": "ckpt_..."}`` is resolved, in
the caller's organization, to the checkpoint's route and sampler snapshot:
``{"checkpoint": "ckpt_...", "route": "qwen3-8b", "snapshot": "object:sha256:..."}``, so
that the pinned spec names the exact weights, and workers and the proxy need nothing else.
The resolver is named by a setting (SYNTH_CHECKPOINT_RESOLVER): checkpoints belong to the
training app, which execution must not import.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from apps.accounts.models import Organization
from apps.core.errors import NotFound


def checkpoint_binding(*, org: Organization, checkpoint_id: str, field: str) -> dict[str, Any]:
    resolver = import_string(settings.SYNTH_CHECKPOINT_RESOLVER)
    binding = resolver(org=org, checkpoint_id=checkpoint_id)
    if binding is None:
        raise NotFound(f"checkpoint {checkpoint_id} not found", field=field)
    return binding


def model_binding_resolve(*, org: Organization, binding: dict[str, Any], field: str = "actor") -> dict[str, Any]:
    """The binding to pin: routes as given, checkpoints resolved to route + snapshot."""
    if binding.get("checkpoint"):
        return checkpoint_binding(org=org, checkpoint_id=binding["checkpoint"], field=f"{field}.model.checkpoint")
    return dict(binding)
