"""Whether a captured call's request re-renders to its captured prompt ids: the one place
that re-renders a payload (the publisher's fallback in prompt_store and ``harness_check``
both use it)."""

from __future__ import annotations

import json
from typing import Any

from apps.proxy.models import Integrity, Interaction


def payload_render_ids(*, payload: dict[str, Any]) -> list[int]:
    """The prompt ids the route's adapter renders from the payload's captured effective
    request (``request_json``: the request after fitting, key order kept)."""
    from apps.proxy.adapters.registry import adapter_for

    adapter = adapter_for(payload["route"]["family"])
    return list(adapter.render(request=json.loads(payload["request_json"])).token_ids)


def interaction_payload(*, interaction: Interaction) -> dict[str, Any]:
    """A captured call's whole token payload, staged or published (read back, sha256-checked)."""
    from apps.objects.selectors import object_get
    from apps.objects.services import object_read
    from apps.proxy.capture import staged_payload

    if interaction.integrity == Integrity.STAGED:
        return staged_payload(interaction=interaction)
    obj = object_get(org=interaction.org, sha256=interaction.payload_sha256)
    return json.loads(object_read(obj=obj))
