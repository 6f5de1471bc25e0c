"""Who is calling the model proxy, and which route and snapshot they may use.

Two kinds of caller:

* attempt: a per-attempt ModelCredential (``synm_...``) held by the agent in a sandbox,
  bound to (organization, run, attempt, route, snapshot, expiry). Whatever model name a
  request carries — the main agent's, a delegated agent's "claude-haiku-*", "sonnet" —
  it is served by the credential's route and snapshot; naming ANOTHER configured route
  is 403 permission_error. Expired or revoked: 401 authentication_error.
* operator: an ApiToken (``syn_...``) of an operator or admin, for interactive sessions
  (``synth claude``) under their organization: any inference-enabled route, resolved by
  name or alias; the route's default snapshot. Viewers (read-only) and worker
  identities (claim and report, nothing else) are 403.

The secret comes from ``x-api-key`` (ANTHROPIC_API_KEY) or ``Authorization: Bearer``
(ANTHROPIC_AUTH_TOKEN); Claude Code's apiKeyHelper sends the same value in both.

Credentials are issued through apps.accounts.services (model_credential_issue); an interactive
session's (``synth claude``) by `interactive_credential_issue` below, for the REST API.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from django.conf import settings
from django.utils import timezone

from apps.accounts.models import Membership, ModelCredential, Organization, Role
from apps.accounts.services import MODEL_CREDENTIAL_SCHEME, token_hash, token_verify
from apps.proxy.errors import AuthenticationFailed, ModelNotFound, PermissionDenied
from apps.proxy.models import ModelRoute
from apps.proxy.selectors import route_match, route_resolve

MODEL_ROLES = (Role.ADMIN, Role.OPERATOR)


@dataclass(frozen=True)
class Caller:
    org: Organization
    kind: Literal["attempt", "operator"]
    token_id: str = ""  # the ApiToken of an operator
    credential: ModelCredential | None = None

    @property
    def key(self) -> str:
        """What admission and the prefix cache scope by: the credential or the token."""
        return self.credential.id if self.credential is not None else self.token_id

    @property
    def run_id(self) -> str:
        return self.credential.run_id if self.credential is not None else ""

    @property
    def trial_id(self) -> str:
        return self.credential.trial_id if self.credential is not None else ""


def attempt_caller(cred: ModelCredential) -> Caller:
    """The caller of an attempt's credential (its row read with its organization)."""
    return Caller(org=cred.org, kind="attempt", credential=cred)


def secret_from_headers(headers: object) -> str | None:
    get = headers.get  # type: ignore[attr-defined]
    key = (get("x-api-key") or "").strip()
    if key:
        return key
    auth = (get("authorization") or "").strip()
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return None


def is_model_credential(secret: str | None) -> bool:
    """Whether `secret` has the form of a model credential (not that it is one)."""
    return secret is not None and secret.startswith(f"{MODEL_CREDENTIAL_SCHEME}_")


def _credential_prefix(secret: str) -> str | None:
    parts = secret.split("_", 2)
    return parts[1] if len(parts) == 3 else None


def _credential_check(*, secret: str, cred: ModelCredential | None) -> ModelCredential:
    """`cred` (the row its prefix found) if `secret` is its secret and it is in force, else 401."""
    # Constant-time comparison even though the prefix matched, so timing tells nothing.
    if cred is None or not hmac.compare_digest(cred.token_hash, token_hash(secret)):
        raise AuthenticationFailed("invalid x-api-key")
    if cred.revoked_at is not None:
        raise AuthenticationFailed("this model credential has been revoked")
    if cred.expires_at <= timezone.now():
        raise AuthenticationFailed("this model credential has expired")
    return cred


def _credential_verify(secret: str) -> ModelCredential:
    prefix = _credential_prefix(secret)
    if prefix is None:
        raise AuthenticationFailed("invalid x-api-key")
    return _credential_check(
        secret=secret, cred=ModelCredential.objects.select_related("org").filter(prefix=prefix).first()
    )


def credential_callers_authenticate(*, secrets: Sequence[str]) -> dict[str, Caller | AuthenticationFailed]:
    """The callers of several model-credential secrets, read in one query; a secret refused
    maps to its error, the one caller_authenticate raises for it alone."""
    prefixes = {secret: _credential_prefix(secret) for secret in secrets}
    wanted = {prefix for prefix in prefixes.values() if prefix is not None}
    rows = ModelCredential.objects.select_related("org").filter(prefix__in=wanted) if wanted else []
    by_prefix = {cred.prefix: cred for cred in rows}
    out: dict[str, Caller | AuthenticationFailed] = {}
    for secret, prefix in prefixes.items():
        try:
            if prefix is None:
                raise AuthenticationFailed("invalid x-api-key")
            cred = _credential_check(secret=secret, cred=by_prefix.get(prefix))
        except AuthenticationFailed as exc:
            out[secret] = exc
        else:
            out[secret] = attempt_caller(cred)
    return out


def caller_authenticate(*, secret: str | None) -> Caller:
    """The caller for a secret, or 401/403."""
    if not secret:
        raise AuthenticationFailed("x-api-key header is required")
    if is_model_credential(secret):
        return attempt_caller(_credential_verify(secret))
    token = token_verify(secret=secret)
    if token is None:
        raise AuthenticationFailed("invalid x-api-key")
    if token.worker is not None:
        raise PermissionDenied("worker identities cannot call models")
    membership = Membership.objects.filter(org=token.org, user=token.user).only("role").first()
    if membership is None:
        raise AuthenticationFailed("invalid x-api-key")
    if membership.role not in MODEL_ROLES:
        raise PermissionDenied("this token's role may not call models (operators and admins may)")
    return Caller(org=token.org, kind="operator", token_id=token.id)


def route_authorize(
    *, caller: Caller, model: str, routes: Sequence[ModelRoute] | None = None
) -> tuple[ModelRoute, str]:
    """(route, snapshot) that serve `model` for this caller, or 403/404.

    `routes`: every route, ordered by name, as the proxy's route cache holds them
    (apps.proxy.lookups); without them they are read here."""
    if routes is None:
        routes = list(ModelRoute.objects.all().order_by("name"))
    cred = caller.credential
    if cred is not None:
        route = next((r for r in routes if r.name == cred.route), None)
        if route is None or not route.inference_enabled:
            raise ModelNotFound(f"model: the route {cred.route!r} of this credential is not available", model=model)
        # Delegated agents (x-claude-code-agent-id) and background calls name Claude
        # models or aliases; they inherit the attempt's route. Only naming a different
        # configured route is an attempt to escape the binding.
        if model != route.name and any(r.name == model for r in routes):
            raise PermissionDenied(f"this credential may only use the model route {route.name!r}, not {model!r}")
        return route, cred.snapshot
    matched = route_match(routes=routes, name=model)
    if matched is None or not matched.inference_enabled:
        raise ModelNotFound(f"model: {model}", model=model)
    return matched, ""


# ISSUANCE
# ------------------------------------------------------------------------------


def interactive_credential_issue(*, org: Any, user: Any, model: str, ttl: Any) -> dict[str, Any]:
    """Issue an interactive session's model credential: one route (or one checkpoint of this
    organization, served by its route with its weights), this organization, `ttl`.

    `model` is a route name or alias, or a checkpoint id (``ckpt_...``).
    """
    import uuid

    from django.utils.module_loading import import_string

    from apps.accounts.services import model_credential_issue
    from apps.core.errors import NotFound

    snapshot = ""
    checkpoint = None
    if model.startswith("ckpt_"):
        # Checkpoints belong to the training app; the proxy reaches them through the
        # configured resolver rather than importing it.
        binding = import_string(settings.SYNTH_CHECKPOINT_RESOLVER)(org=org, checkpoint_id=model)
        if binding is None:
            raise NotFound(f"checkpoint {model} not found", field="model")
        checkpoint, snapshot = binding["checkpoint"], binding["snapshot"]
        route = route_resolve(name=binding["route"])
    else:
        route = route_resolve(name=model)
    if route is None or not route.inference_enabled:
        raise NotFound(f"no model route {model!r}", field="model")
    session = f"session-{uuid.uuid4().hex[:16]}"
    cred, secret = model_credential_issue(
        org=org, run_id="interactive", trial_id=session, route=route.name, snapshot=snapshot, ttl=ttl
    )
    return {
        "credential": secret,
        "route": route.name,
        "checkpoint": checkpoint,
        "family": route.family,
        "base_url": settings.SYNTH_PROXY_PUBLIC_URL or settings.SYNTH_PUBLIC_URL,
        "session": session,
        "expires_at": cred.expires_at,
    }
