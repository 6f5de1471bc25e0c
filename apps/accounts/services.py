"""Writes for organizations, memberships, tokens and worker identities."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from apps.accounts.models import (
    ApiToken,
    Membership,
    ModelCredential,
    Organization,
    Role,
    WorkerIdentity,
)

TOKEN_SCHEME = "syn"
# last_used_at is refreshed at most this often, so that reads do not turn into writes.
LAST_USED_GRANULARITY = timedelta(minutes=1)


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    secret: str  # the full bearer string; shown once, never stored


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _new_secret() -> tuple[str, str]:
    prefix = secrets.token_hex(6)  # 12 hex chars, the lookup key
    return prefix, f"{TOKEN_SCHEME}_{prefix}_{secrets.token_urlsafe(32)}"


def org_get_or_create(*, slug: str, name: str = "") -> Organization:
    org, _ = Organization.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    return org


@transaction.atomic
def membership_set(*, org: Organization, username: str, role: str = Role.OPERATOR) -> Membership:
    user, _ = get_user_model().objects.get_or_create(username=username)
    membership, _ = Membership.objects.update_or_create(org=org, user=user, defaults={"role": role})
    return membership


def token_issue(
    *,
    org: Organization,
    user: AbstractBaseUser,
    name: str = "",
    expires_at: datetime | None = None,
) -> IssuedToken:
    if not Membership.objects.filter(org=org, user=user).exists():
        raise ValueError(f"{user} is not a member of {org.slug}")
    prefix, secret = _new_secret()
    token = ApiToken.objects.create(
        org=org,
        user=user,
        name=name,
        prefix=prefix,
        token_hash=token_hash(secret),
        expires_at=expires_at,
    )
    return IssuedToken(token=token, secret=secret)


def worker_token_issue(*, worker: WorkerIdentity, name: str = "", expires_at: datetime | None = None) -> IssuedToken:
    prefix, secret = _new_secret()
    token = ApiToken.objects.create(
        worker=worker,
        org=worker.org,
        name=name,
        prefix=prefix,
        token_hash=token_hash(secret),
        expires_at=expires_at,
    )
    return IssuedToken(token=token, secret=secret)


def worker_get_or_create(*, name: str, org: Organization | None = None) -> WorkerIdentity:
    worker, _ = WorkerIdentity.objects.get_or_create(name=name, defaults={"org": org})
    return worker


def token_revoke(*, token: ApiToken) -> None:
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


def token_verify(*, secret: str, with_role: bool = False) -> ApiToken | None:
    """The live token for a bearer string, or None (unknown, wrong, expired, revoked).

    ``with_role``: the token also carries ``member_role``, its user's role in the token's
    organization (None for a worker's token or a user no longer a member), read in the
    same query: every API request needs both, and a second look-up was a round trip and
    a query compilation per request."""
    parts = secret.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_SCHEME:
        return None
    tokens = ApiToken.objects.select_related("org", "user", "worker").filter(prefix=parts[1])
    if with_role:
        tokens = tokens.annotate(
            member_role=Subquery(
                Membership.objects.filter(org_id=OuterRef("org_id"), user_id=OuterRef("user_id")).values("role")[:1]
            )
        )
    # Unordered: the prefix is unique (first() would compile an ORDER BY for nothing).
    token = next(iter(tokens[:1]), None)
    # Compare in constant time even though the prefix matched, so timing tells nothing.
    if token is None or not hmac.compare_digest(token.token_hash, token_hash(secret)):
        return None
    now = timezone.now()
    if token.revoked_at is not None or (token.expires_at is not None and token.expires_at <= now):
        return None
    if token.worker is not None and token.worker.disabled_at is not None:
        return None
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_GRANULARITY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


# MODEL CREDENTIALS
# ------------------------------------------------------------------------------
# Scheme of per-attempt model credentials: distinct from TOKEN_SCHEME so that a secret
# names the table it lives in (and an attempt credential never authenticates /api).
MODEL_CREDENTIAL_SCHEME = "synm"


def model_credential_issue(
    *,
    org: Organization,
    run_id: str,
    trial_id: str,
    route: str,
    snapshot: str,
    ttl: timedelta,
    role: str = "actor",
    sampling: dict[str, Any] | None = None,
) -> tuple[ModelCredential, str]:
    """A credential for one attempt's model calls (its agent's, or its judge's with
    ``role="judge"``): (row, secret). The secret is shown once. ``sampling``: the settings
    the proxy holds its calls to (ModelCredential.sampling)."""
    if ttl <= timedelta(0):
        raise ValueError("ttl must be positive")
    prefix = secrets.token_hex(6)
    secret = f"{MODEL_CREDENTIAL_SCHEME}_{prefix}_{secrets.token_urlsafe(32)}"
    cred = ModelCredential.objects.create(
        org=org,
        run_id=run_id,
        trial_id=trial_id,
        route=route,
        snapshot=snapshot,
        role=role,
        sampling=dict(sampling or {}),
        prefix=prefix,
        token_hash=token_hash(secret),
        expires_at=timezone.now() + ttl,
    )
    return cred, secret


def model_credential_revoke(*, cred: ModelCredential) -> None:
    ModelCredential.objects.filter(pk=cred.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
