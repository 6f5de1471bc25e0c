"""Capture of model calls: staged before the response completes, published after delivery.

Lifecycle of an Interaction (three independent facts):

* integrity: ``staged`` — the row, written before message_stop (stream) or before the JSON
  is returned, holds the whole token payload (the prompt ids packed, possibly as a delta
  on the conversation's previous call: prompt_store); ``published`` — the evidence
  publisher (Celery task "evidence.publish" on the evidence queue) uploaded the payload's
  canonical JSON, its prompt ids rebuilt, create-only under its sha256 and committed the
  reference, clearing the staged payload; ``verified`` — the stored bytes were read back
  and matched the sha256.
* delivery: ``pending`` until the response is handed over in full (``delivered``), the
  client went away first (``client_disconnected``) or the call failed (``failed``).
* learning eligibility: ``unknown`` while pending; then ``eligible`` for a delivered call
  of an attempt, or ``ineligible`` with a reason (interactive, disconnected, failed,
  logprobs missing). Training's own qualification comes on top of this.

Staging first means a crash after the client got its answer can lose no evidence: the
row exists, and the sweeper (``evidence.sweep``) re-enqueues staged rows whose publish
message was lost. Publishing is idempotent: content addressing makes a second upload a
no-op, and state changes are conditional updates.

Each of delivery and integrity has its table of moves (`DELIVERY_TRANSITIONS`,
`INTEGRITY_TRANSITIONS`) and one writer, `interaction_transition`. Their record is the row
itself (delivered_at, published_at, verified_at are set by the same UPDATE) rather than a
run event: a call need not belong to a run, and a run event per call would serialize a
run's model calls on its row lock.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import orjson
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.core.bulk import row_insert
from apps.core.transitions import TransitionTable
from apps.objects.models import StoredObject
from apps.objects.selectors import object_get
from apps.objects.services import object_put, object_read
from apps.proxy import prompt_store, publish_batch
from apps.proxy.models import Delivery, Eligibility, Integrity, Interaction
from synth_common.canonical import canonical_bytes

logger = logging.getLogger(__name__)

PAYLOAD_FORMAT = "synth.interaction/1"
PAYLOAD_CONTENT_TYPE = "application/json"
# Staging happens after sampling, so only the streaming of parsed blocks remains.
UNSETTLED_AFTER = timedelta(minutes=10)

DELIVERY_TRANSITIONS = TransitionTable(
    model=Interaction,
    field="delivery",
    moves={Delivery.PENDING: {Delivery.DELIVERED, Delivery.CLIENT_DISCONNECTED, Delivery.FAILED}},
)
INTEGRITY_TRANSITIONS = TransitionTable(
    model=Interaction,
    field="integrity",
    moves={Integrity.STAGED: {Integrity.PUBLISHED}, Integrity.PUBLISHED: {Integrity.VERIFIED}},
)
TABLES = {"delivery": DELIVERY_TRANSITIONS, "integrity": INTEGRITY_TRANSITIONS}


def interaction_transition(*, interaction_id: str, field: str, to: str, values: dict[str, Any] | None = None) -> bool:
    """Move an interaction's delivery or integrity (a claim: False if another process got
    there first or the move is not allowed from where it is)."""
    moved = TABLES[field].claim(pk=interaction_id, to=to, values=values)
    if moved:
        logger.debug("interaction %s: %s -> %s", interaction_id, field, to)
    return moved


def finite_floats(values: list[Any]) -> tuple[list[float | None], bool]:
    """Logprobs with non-finite values replaced by None (JSON and canonical bytes refuse
    NaN/inf), and whether all were finite."""
    out: list[float | None] = []
    ok = True
    for v in values:
        if isinstance(v, (int, float)) and math.isfinite(v):
            out.append(float(v))
        else:
            out.append(None)
            ok = False
    return out, ok


@dataclass
class CaptureRecord:
    """Everything staged about one call; built by services, written here."""

    org_id: str
    principal_kind: str
    credential_id: str
    token_id: str
    run_id: str
    trial_id: str
    correlation_id: str
    session_id: str
    agent_id: str
    parent_agent_id: str
    request_id: str
    route_id: str
    route: dict[str, Any]
    model_requested: str
    stream: bool
    snapshot: dict[str, Any]
    request: dict[str, Any]  # the effective request (after fitting): what was rendered
    sampling: dict[str, Any]
    fitting: list[dict[str, Any]]
    original_prompt_tokens: int
    prompt_ids: list[int]
    prompt_reused_ids: int
    output_ids: list[int] = field(default_factory=list)
    delivered_output_ids: int | None = None  # set when a stop sequence cut the output
    logprobs: list[Any] = field(default_factory=list)
    finish: str = ""
    content: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str = ""
    stop_sequence: str | None = None
    parse_errors: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    error: str = ""
    betas: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    role: str = "actor"
    protocol: str = "messages"  # messages, chat or responses: the wire protocol of the call


def _request_bytes(request: dict[str, Any]) -> bytes:
    """The request as compact JSON text (UTF-8), its key order kept. orjson writes it
    several times faster than json (the 440 KB of a 100K-token conversation: 0.4 against
    1.2 ms, on every call); json writes what orjson refuses (an integer beyond 64 bits).
    Either text loads back to the same request: it was parsed by json_loads_strict, so it
    holds no value the two would write differently (a non-finite float, a lone surrogate)."""
    try:
        return orjson.dumps(request)
    except orjson.JSONEncodeError:
        return json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode()


def _payload(
    interaction_id: str, rec: CaptureRecord, logprobs: list[float | None], request_text: str
) -> dict[str, Any]:
    return {
        "format": PAYLOAD_FORMAT,
        "id": interaction_id,
        "org": rec.org_id,
        "run_id": rec.run_id,
        "trial_id": rec.trial_id,
        "correlation_id": rec.correlation_id,
        "session_id": rec.session_id,
        "agent_id": rec.agent_id,
        "parent_agent_id": rec.parent_agent_id,
        "role": rec.role,
        "request_id": rec.request_id,
        "route": rec.route,
        "model_requested": rec.model_requested,
        "protocol": rec.protocol,
        "snapshot": rec.snapshot,
        # JSON text, not an object: the template serializes tool schemas and arguments in
        # their key order, which JSONB storage and canonical JSON (sorted keys) would not
        # keep. json.loads of this string re-renders to exactly `prompt_ids`.
        "request_json": request_text,
        "sampling": rec.sampling,
        "fitting": rec.fitting,
        "original_prompt_tokens": rec.original_prompt_tokens,
        "prompt_ids": rec.prompt_ids,
        "prompt_reused_ids": rec.prompt_reused_ids,
        "output_ids": rec.output_ids,
        "delivered_output_ids": rec.delivered_output_ids,
        "logprobs": logprobs,
        "finish": rec.finish,
        "content": rec.content,
        "stop_reason": rec.stop_reason,
        "stop_sequence": rec.stop_sequence,
        "parse_errors": rec.parse_errors,
        "timings": rec.timings,
        "error": rec.error,
        "anthropic_beta": rec.betas,
        "metadata": rec.metadata,
    }


def conversation_key(rec: CaptureRecord) -> prompt_store.ConversationKey:
    """Whose calls extend each other: one caller's session and agent on one route."""
    return (rec.org_id, rec.credential_id, rec.token_id, rec.route_id, rec.session_id, rec.agent_id)


def interaction_stage(*, rec: CaptureRecord, delivery: str = Delivery.PENDING, compact: bool = True) -> Interaction:
    """Write the row with its whole payload (integrity staged). Called before the
    response completes; `delivery` is pending unless the call already failed.

    The prompt ids go to the row's packed prompt columns, a delta on the conversation's
    previous call when it extends it (prompt_store), and then the request's text too,
    when it shares enough with that call's; `compact=False`, or ids that do not pack,
    keeps both in the JSON payload as rows staged before compact prompts did."""
    logprobs, finite = finite_floats(rec.logprobs)
    interaction = Interaction(
        org_id=rec.org_id,
        principal_kind=rec.principal_kind,
        credential_id=rec.credential_id,
        token_id=rec.token_id,
        run_id=rec.run_id,
        trial_id=rec.trial_id,
        correlation_id=rec.correlation_id[:100],
        session_id=rec.session_id[:100],
        agent_id=rec.agent_id[:100],
        parent_agent_id=rec.parent_agent_id[:100],
        role=rec.role,
        request_id=rec.request_id,
        route_id=rec.route_id,
        model_requested=rec.model_requested[:300],
        protocol=rec.protocol,
        snapshot=rec.snapshot,
        stream=rec.stream,
        stop_reason=rec.stop_reason,
        parse_errors=rec.parse_errors,
        prompt_tokens=len(rec.prompt_ids),
        output_tokens=len(rec.output_ids),
        fitted=bool(rec.fitting),
        timings=rec.timings,
        delivery=delivery,
        delivery_error=rec.error,
        integrity=Integrity.STAGED,
    )
    key = conversation_key(rec)
    prompt = prompt_store.prompt_encode(key=key, ids=rec.prompt_ids) if compact else None
    request = _request_bytes(rec.request)
    request_delta = prompt_store.request_delta(staged=prompt, request=request) if prompt is not None else None
    payload = _payload(interaction.id, rec, logprobs, "" if request_delta else request.decode())
    if prompt is not None:
        del payload["prompt_ids"]  # rebuilt into the same place when published
        interaction.prompt_ids_packed = prompt.packed
        interaction.prompt_base_id = prompt.base_id
        interaction.prompt_shared = prompt.shared
        interaction.prompt_depth = prompt.depth
        interaction.prompt_sha256 = prompt.sha256
    if request_delta is not None:
        del payload["request_json"]  # rebuilt into the same place when published
        payload["request_json_delta"] = request_delta
    interaction.payload = payload
    if not finite or len(rec.logprobs) != len(rec.output_ids):
        # Known now and independent of delivery: no importance weights for this call.
        interaction.eligibility = Eligibility.INELIGIBLE
        interaction.eligibility_reason = "logprobs missing or not finite"
    row_insert(obj=interaction)  # save(force_insert=True) without the ORM's per-row cost
    if prompt is not None:
        # A base only once committed: a row rolled back must never be a later call's base.
        transaction.on_commit(
            lambda: prompt_store.prompt_remember(key=key, interaction_id=interaction.id, staged=prompt, request=request)
        )
    return interaction


def staged_payload(*, interaction: Interaction) -> dict[str, Any]:
    """A staged interaction's whole payload, its prompt ids rebuilt: what gets published."""
    if interaction.payload is None:
        raise ValueError(f"{interaction.id} is staged without a payload")
    payload = dict(interaction.payload)
    published: prompt_store.Published = {}  # a base's object, read once for both
    if "request_json_delta" in payload:
        payload["request_json"] = prompt_store.staged_request_text(
            interaction=interaction, payload=payload, published=published
        )
        del payload["request_json_delta"]
    payload["prompt_ids"] = prompt_store.staged_prompt_ids(
        interaction=interaction, payload=payload, published=published
    )
    return payload


def _eligibility(interaction: Interaction, delivery: str) -> tuple[str, str]:
    if interaction.eligibility == Eligibility.INELIGIBLE:
        return interaction.eligibility, interaction.eligibility_reason
    if delivery == Delivery.FAILED:
        return Eligibility.INELIGIBLE, "the call failed"
    if delivery == Delivery.CLIENT_DISCONNECTED:
        return Eligibility.INELIGIBLE, "the client disconnected before the response completed"
    if interaction.principal_kind != "attempt":
        return Eligibility.INELIGIBLE, "interactive session (no attempt)"
    if interaction.role != "actor":
        return Eligibility.INELIGIBLE, "a judge's call (it assessed the attempt)"
    return Eligibility.ELIGIBLE, ""


def interaction_settle(
    *, interaction_id: str, delivery: str, error: str = "", staged: Interaction | None = None
) -> None:
    """Record how delivery ended (once: a pending row only) and the eligibility that
    follows, then hand the row to the publisher. ``staged``: the row as this process staged
    it, when it has it (the proxy's delivery): what eligibility depends on is then known
    without reading the row again."""
    # What eligibility depends on is fixed at staging: read without a lock, then claim.
    interaction = staged
    if interaction is None:
        interaction = (
            Interaction.objects.only("id", "principal_kind", "role", "eligibility", "eligibility_reason", "delivery")
            .filter(pk=interaction_id)
            .first()
        )
        if interaction is None or interaction.delivery != Delivery.PENDING:
            return
    elif interaction.id != interaction_id:
        raise ValueError(f"staged row {interaction.id} is not {interaction_id}")
    eligibility, reason = _eligibility(interaction, delivery)
    if not interaction_transition(
        interaction_id=interaction_id,
        field="delivery",
        to=delivery,
        values={
            "delivery_error": error[:2000],
            "delivered_at": timezone.now() if delivery == Delivery.DELIVERED else None,
            "eligibility": eligibility,
            "eligibility_reason": reason,
        },
    ):
        return
    publish_enqueue(interaction_id=interaction_id)


@dataclass(frozen=True)
class Settlement:
    """How one staged call's delivery ended, for ``interactions_settle``."""

    interaction_id: str
    delivery: str
    error: str = ""
    staged: Interaction | None = None  # the row as this process staged it


def interactions_settle(*, settlements: Sequence[Settlement]) -> None:
    """``interaction_settle`` for many calls at once (the proxy's settles that gathered while
    one was written): the rows with the same outcome (delivery, error, eligibility) are
    claimed by one UPDATE that returns those it moved, and only those are handed to the
    publisher. A settlement without its staged row is settled alone, as before."""
    outcomes: dict[tuple[str, str, str, str], list[str]] = {}
    for settlement in settlements:
        staged = settlement.staged
        if staged is None or staged.id != settlement.interaction_id:
            interaction_settle(
                interaction_id=settlement.interaction_id,
                delivery=settlement.delivery,
                error=settlement.error,
                staged=staged,
            )
            continue
        eligibility, reason = _eligibility(staged, settlement.delivery)
        key = (settlement.delivery, settlement.error[:2000], eligibility, reason)
        outcomes.setdefault(key, []).append(settlement.interaction_id)
    for (delivery, error, eligibility, reason), ids in outcomes.items():
        moved = TABLES["delivery"].claim_each(
            pks=ids,
            to=delivery,
            values={
                "delivery_error": error,
                "delivered_at": timezone.now() if delivery == Delivery.DELIVERED else None,
                "eligibility": eligibility,
                "eligibility_reason": reason,
            },
        )
        logger.debug("interactions settled %s: %s of %s", delivery, len(moved), len(ids))
        for interaction_id in moved:
            publish_enqueue(interaction_id=interaction_id)


def publish_enqueue(*, interaction_id: str) -> None:
    """Queue the publication. A broker failure must not fail the call: the row is staged
    and the sweeper will find it. In the proxy's process the id joins the process' next
    batch (apps.proxy.publish_batch), sent within SYNTH_PROXY_PUBLISH_BATCH_SECONDS."""
    from apps.proxy.tasks import evidence_publish_task

    if settings.SYNTH_PROXY_PROCESS and settings.SYNTH_PROXY_PUBLISH_BATCH_SECONDS > 0:
        publish_batch.batcher(seconds=settings.SYNTH_PROXY_PUBLISH_BATCH_SECONDS).add(interaction_id)
        return
    try:
        evidence_publish_task.apply_async(args=[interaction_id], retry=False)
    except Exception:  # noqa: BLE001 - the sweeper is the fallback
        logger.warning("could not enqueue evidence.publish for %s; the sweeper will retry", interaction_id)


def interaction_publish(*, interaction_id: str) -> str:
    """Upload a staged payload create-only with its sha256, commit the reference, clear
    the payload; then read it back and mark it verified. Idempotent. Returns the state."""
    return interaction_evidence(interaction_id=interaction_id)[0]


def interaction_evidence(*, interaction_id: str) -> tuple[str, bytes | None]:
    """``interaction_publish``, and the payload's bytes when this call verified them (read
    back from the store and re-hashed): a learner that publishes what it is about to train
    on need not look up and read the object once more. None if it was verified before."""
    interaction = Interaction.objects.select_related("org").filter(pk=interaction_id).first()
    if interaction is None:
        return "missing", None
    obj: StoredObject | None = None
    if interaction.integrity == Integrity.STAGED:
        data = canonical_bytes(staged_payload(interaction=interaction))
        obj = object_put(org=interaction.org, data=data, content_type=PAYLOAD_CONTENT_TYPE)
        # A claim: a concurrent publisher that got here first already did the same.
        if interaction_transition(
            interaction_id=interaction_id,
            field="integrity",
            to=Integrity.PUBLISHED,
            values={
                "payload_sha256": obj.sha256,
                "payload_size": obj.size,
                "published_at": timezone.now(),
                "payload": None,
                # Later calls based on this one read its prompt from the published object.
                "prompt_ids_packed": None,
            },
        ):
            interaction.integrity, interaction.payload_sha256 = Integrity.PUBLISHED, obj.sha256
        else:
            interaction.refresh_from_db(fields=["integrity", "payload_sha256"])
    if interaction.integrity == Integrity.PUBLISHED:
        if obj is None or obj.sha256 != interaction.payload_sha256:
            obj = object_get(org=interaction.org, sha256=interaction.payload_sha256)
        verified = object_read(obj=obj)  # re-hashes the stored bytes; raises if they do not match
        interaction_transition(
            interaction_id=interaction_id,
            field="integrity",
            to=Integrity.VERIFIED,
            values={"verified_at": timezone.now()},
        )
        return Integrity.VERIFIED, verified
    return interaction.integrity, None


def staged_sweep(*, older_than: timedelta = timedelta(minutes=2), limit: int = 500) -> int:
    """Re-enqueue staged interactions whose publication has not happened (a lost message,
    a crash between staging and delivery). Bounded per sweep."""
    cutoff = timezone.now() - older_than
    # A row still pending long after staging belongs to a proxy that stopped mid-response.
    for interaction_id in Interaction.objects.filter(
        delivery=Delivery.PENDING, created_at__lt=timezone.now() - UNSETTLED_AFTER
    ).values_list("id", flat=True)[:limit]:
        interaction_settle(interaction_id=interaction_id, delivery=Delivery.FAILED, error="never settled")
    ids = list(
        Interaction.objects.filter(integrity__in=[Integrity.STAGED, Integrity.PUBLISHED], created_at__lt=cutoff)
        .order_by("created_at")
        .values_list("id", flat=True)[:limit]
    )
    for interaction_id in ids:
        publish_enqueue(interaction_id=interaction_id)
    return len(ids)
