from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from apps.core.ids import PrefixedIdField


class Organization(models.Model):
    id = PrefixedIdField(prefix="org")
    slug = models.SlugField(
        max_length=64,
        unique=True,
        help_text="Used in references such as team/dataset@v1.",
    )
    name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    ADMIN = "admin"
    OPERATOR = "operator"
    VIEWER = "viewer"


class Membership(models.Model):
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.OPERATOR)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "user"], name="membership_unique_org_user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.org} ({self.role})"


class WorkerIdentity(models.Model):
    """A service identity for workers: it may claim work and report on it, nothing else.

    `org` empty means a platform worker that serves every organization; set, the worker
    only ever sees that organization's work.
    """

    id = PrefixedIdField(prefix="wrk")
    name = models.CharField(max_length=100, unique=True)
    org = models.ForeignKey(
        Organization,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="workers",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    disabled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "worker identities"

    def __str__(self) -> str:
        return self.name


class ApiToken(models.Model):
    """A bearer token, of a user in one organization or of a worker identity.

    Only a lookup prefix and the SHA-256 of the whole token are stored; the secret is
    shown once at creation. A fast hash is right here (unlike passwords): the secret has
    256 bits of entropy, so there is nothing to brute-force.
    """

    id = PrefixedIdField(prefix="tok")
    org = models.ForeignKey(
        Organization,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="tokens",
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="api_tokens",
    )
    worker = models.ForeignKey(
        WorkerIdentity,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="tokens",
    )
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, unique=True)
    token_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(Q(user__isnull=False, org__isnull=False, worker__isnull=True))
                | Q(user__isnull=True, worker__isnull=False),
                name="apitoken_user_xor_worker",
            )
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.worker or self.user})"


class ModelCredential(models.Model):
    """A short-lived model credential for one attempt: what the sandboxed agent holds.

    Bound to an organization, a run and an attempt (plain ids: accounts must not depend on
    runs), one model route and the sampler snapshot it may use, and an expiry. The model
    proxy serves it that route and snapshot only. Stored like ApiToken: a lookup prefix and
    the SHA-256 of the whole secret; the secret is handed out once.
    """

    id = PrefixedIdField(prefix="mcr")
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="model_credentials")
    run_id = models.CharField(max_length=40, db_index=True)
    trial_id = models.CharField(max_length=40, db_index=True)
    route = models.CharField(max_length=100, help_text="model route name")
    snapshot = models.CharField(max_length=300, blank=True, help_text="sampler snapshot (base, checkpoint ...)")
    role = models.CharField(
        max_length=16, default="actor", help_text="actor (the attempt's agent) or judge (its assessment)"
    )
    # The run plan's sampling settings, held for every call made with this credential: the
    # harness's own request values do not override what the plan (and so the learner) assumes.
    sampling = models.JSONField(
        default=dict, blank=True, help_text="temperature, top_p, top_k, max_tokens (a cap), seed (this attempt's)"
    )
    prefix = models.CharField(max_length=16, unique=True)
    token_hash = models.CharField(max_length=64)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.trial_id} -> {self.route})"
