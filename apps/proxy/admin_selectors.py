"""Reads behind the interaction admin page: the captured prompt and completion as text,
decoded from the captured ids with the route's tokenizer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from apps.objects.selectors import object_get
from apps.objects.services import object_read
from apps.proxy.capture import staged_payload
from apps.proxy.models import Interaction
from apps.proxy.tokenizers import tokenizer_load

# Tokens decoded on the page: the end of the prompt (the newest turns) and the start of
# the completion; a whole payload can be a context window of ids.
PROMPT_TOKENS_SHOWN = 4000
OUTPUT_TOKENS_SHOWN = 4000


@dataclass(frozen=True)
class Decoded:
    prompt: str = ""
    prompt_omitted: int = 0  # leading prompt tokens not decoded
    completion: str = ""
    completion_omitted: int = 0  # trailing output tokens not decoded
    error: str = ""


def interaction_payload(*, interaction: Interaction) -> dict[str, Any] | None:
    """The token payload: still staged in the row, or published to the object store."""
    fresh = Interaction.objects.filter(pk=interaction.pk).first()
    if fresh is not None and fresh.payload is not None:
        # Staged prompt ids may be packed or a delta on an earlier call: rebuild them exactly.
        return staged_payload(interaction=fresh)
    if not interaction.payload_sha256:
        return None
    obj = object_get(org=interaction.org, sha256=interaction.payload_sha256)
    return json.loads(object_read(obj=obj))


def interaction_decode(
    *, interaction: Interaction, prompt_limit: int = PROMPT_TOKENS_SHOWN, output_limit: int = OUTPUT_TOKENS_SHOWN
) -> Decoded:
    try:
        payload = interaction_payload(interaction=interaction)
    except Exception as exc:  # noqa: BLE001 - an unreadable payload must not break the page
        return Decoded(error=f"the payload cannot be read: {exc}")
    if payload is None:
        return Decoded(error="no payload was captured")
    try:
        tokenizer = tokenizer_load(interaction.route.tokenizer)
    except Exception as exc:  # noqa: BLE001 - not provisioned here, unknown family
        return Decoded(error=f"the route's tokenizer cannot be loaded: {exc}")
    prompt_ids = list(payload.get("prompt_ids") or [])
    output_ids = list(payload.get("output_ids") or [])
    shown_prompt = prompt_ids[-prompt_limit:] if prompt_limit else []
    shown_output = output_ids[:output_limit]
    # Special tokens stay: the chat template's markers show where each turn starts.
    return Decoded(
        prompt=tokenizer.decode(shown_prompt, skip_special_tokens=False),
        prompt_omitted=len(prompt_ids) - len(shown_prompt),
        completion=tokenizer.decode(shown_output, skip_special_tokens=False),
        completion_omitted=len(output_ids) - len(shown_output),
    )
