"""Model routes (what the proxy can serve) and captured interactions (what it served)."""

from __future__ import annotations

from django.db import models

from apps.accounts.models import Organization
from apps.core.ids import PrefixedIdField


class ModelRoute(models.Model):
    """A model the proxy serves: chat format (family + tokenizer), limits, and sampler.

    Inference usefulness (`inference_enabled`) and training admission (`trainable`) are
    separate facts: an OpenAI-compatible endpoint may serve well and never train; a route
    may be kept trainable while its inference is switched off.
    """

    id = PrefixedIdField(prefix="rte")
    name = models.CharField(max_length=100, unique=True)
    family = models.CharField(max_length=50, help_text="adapter family key, e.g. qwen3")
    tokenizer = models.CharField(max_length=100, help_text="tokenizer directory name under SYNTH_TOKENIZER_DIR")
    context_window = models.PositiveIntegerField()
    max_output = models.PositiveIntegerField()
    sampler_backend = models.CharField(max_length=50, help_text="local, tinker, openai_compat, scripted ...")
    sampler_config = models.JSONField(default=dict, blank=True)
    trainable = models.BooleanField(default=False)
    inference_enabled = models.BooleanField(default=True)
    aliases = models.JSONField(
        default=list,
        blank=True,
        help_text='names Claude Code may send, exact or glob ("claude-*", "sonnet")',
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=models.Q(max_output__gt=0), name="modelroute_max_output_positive"),
            models.CheckConstraint(
                condition=models.Q(context_window__gt=models.F("max_output")),
                name="modelroute_window_above_output",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Protocol(models.TextChoices):
    MESSAGES = "messages"  # Anthropic Messages
    CHAT = "chat"  # OpenAI Chat Completions
    RESPONSES = "responses"  # OpenAI Responses


class Delivery(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    CLIENT_DISCONNECTED = "client_disconnected"
    FAILED = "failed"


class Integrity(models.TextChoices):
    STAGED = "staged"  # payload in the row, not yet in object storage
    PUBLISHED = "published"  # uploaded create-only and referenced
    VERIFIED = "verified"  # read back and checked against payload_sha256


class Eligibility(models.TextChoices):
    UNKNOWN = "unknown"
    ELIGIBLE = "eligible"
    INELIGIBLE = "ineligible"


class Interaction(models.Model):
    """One model call as the proxy served it: correlation, exact tokens, three states.

    The token payload (prompt ids, sampled ids, logprobs, effective prompt, fitting) is
    staged before the response completes, the prompt ids packed in `prompt_ids_*` and the
    rest in `payload`, then published to object storage by the evidence publisher, which
    sets `payload_sha256` and clears the staged columns.
    Delivery, integrity and learning eligibility are separate facts with separate states.
    """

    id = PrefixedIdField(prefix="int")
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="interactions")
    # Who called: a per-attempt credential (scoped) or an operator token (interactive).
    principal_kind = models.CharField(max_length=16)
    credential_id = models.CharField(max_length=40, blank=True)
    token_id = models.CharField(max_length=40, blank=True)
    # Correlation: run and attempt from the credential; the rest from Claude Code's headers.
    run_id = models.CharField(max_length=40, blank=True, db_index=True)
    trial_id = models.CharField(max_length=40, blank=True, db_index=True)
    correlation_id = models.CharField(max_length=100, blank=True, help_text="x-synth-trial header")
    session_id = models.CharField(max_length=100, blank=True)
    agent_id = models.CharField(max_length=100, blank=True)
    parent_agent_id = models.CharField(max_length=100, blank=True)
    role = models.CharField(max_length=16, default="actor", help_text="actor, or judge (assessment calls)")
    request_id = models.CharField(max_length=40, blank=True)
    # What served it.
    route = models.ForeignKey(ModelRoute, on_delete=models.PROTECT, related_name="interactions")
    model_requested = models.CharField(max_length=300)
    snapshot = models.JSONField(default=dict, blank=True, help_text="the sampler snapshot that sampled")
    stream = models.BooleanField(default=False)
    protocol = models.CharField(
        max_length=16, choices=Protocol.choices, default=Protocol.MESSAGES, help_text="the wire protocol of the call"
    )
    # Outcome summary (the tokens are in the payload).
    stop_reason = models.CharField(max_length=32, blank=True)
    parse_errors = models.JSONField(default=list, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    fitted = models.BooleanField(default=False, help_text="content was omitted to fit the context window")
    timings = models.JSONField(default=dict, blank=True, help_text="milliseconds: queue, render, sample, parse, total")
    # Delivery.
    delivery = models.CharField(max_length=24, choices=Delivery.choices, default=Delivery.PENDING)
    delivery_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # Integrity.
    integrity = models.CharField(max_length=16, choices=Integrity.choices, default=Integrity.STAGED)
    payload = models.JSONField(null=True, blank=True, help_text="staged token payload; cleared once published")
    # The staged prompt ids, compact (apps/proxy/prompt_store.py), outside the JSON payload:
    # little-endian uint32 ids, the whole prompt (a snapshot, no base) or, after the first
    # `prompt_shared` ids of the base interaction's prompt, the rest (a delta). Null on rows
    # staged before this existed (their ids are in `payload`); cleared once published.
    prompt_ids_packed = models.BinaryField(null=True, blank=True)
    # Not a foreign key: the base may be deleted on its own; the reader then falls back.
    # All nullable: adding them rewrites no existing row.
    prompt_base_id = models.CharField(max_length=40, null=True, blank=True)  # None: a snapshot
    prompt_shared = models.PositiveIntegerField(null=True, blank=True)
    prompt_depth = models.PositiveSmallIntegerField(null=True, blank=True, help_text="deltas since the snapshot")
    prompt_sha256 = models.CharField(  # None on rows staged before
        max_length=64, null=True, blank=True, help_text="sha256 of the whole prompt, packed"
    )
    payload_sha256 = models.CharField(max_length=64, blank=True)
    payload_size = models.PositiveBigIntegerField(null=True, blank=True)
    published_at = models.DateTimeField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)
    # Learning eligibility.
    eligibility = models.CharField(max_length=16, choices=Eligibility.choices, default=Eligibility.UNKNOWN)
    eligibility_reason = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["org", "run_id", "trial_id"]),
            models.Index(fields=["integrity", "created_at"]),
        ]

    def __str__(self) -> str:
        return self.id


class HarnessCheck(models.Model):
    """One conformance check of a harness build against this proxy (``manage.py harness_check``).

    A harness build is the executable (or agent file) the trials hosts actually run,
    identified by its sha256 (``digest``): a train run refuses an engine whose installed
    build has no passing check (apps.trials.harness_check). Platform-wide like routes, not
    per organization: the build is a property of the installation.
    """

    id = PrefixedIdField(prefix="hck")
    engine = models.CharField(max_length=50)
    harness_version = models.CharField(max_length=100, blank=True)
    digest = models.CharField(max_length=64, help_text="sha256 of the harness executable or file that was run")
    family = models.CharField(max_length=50, help_text="the chat adapter family it was checked against")
    passed = models.BooleanField(default=False)
    report = models.JSONField(default=dict, blank=True, help_text="request shapes, per-call checks, failures")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["engine", "digest", "passed"])]

    def __str__(self) -> str:
        return f"{self.engine} {self.harness_version} {'passed' if self.passed else 'failed'}"
