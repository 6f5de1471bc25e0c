from __future__ import annotations

from django.conf import settings
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from apps.accounts.principal import Principal
from apps.accounts.services import token_hash, token_verify
from synth_common.fresh_cache import FreshCache

# Principals kept at most (a bound on memory; freshness decides what is served).
PRINCIPAL_ENTRIES = 4096

# Who each recently seen bearer token is, by the SHA-256 of its secret (the secret itself
# is not kept): every API request authenticates, and the read (token, organization, user,
# worker and role in one query) was a fifth of a run submission's time. A revocation, an
# expiry, a removed membership or a disabled worker takes effect within
# SYNTH_API_LOOKUP_CHECK_SECONDS, however it was written; expiry is also checked on every
# use from the cached row.
principals: FreshCache[str, Principal] = FreshCache(
    maxsize=PRINCIPAL_ENTRIES, check_seconds=lambda: settings.SYNTH_API_LOOKUP_CHECK_SECONDS
)


def bearer_from_headers(headers: dict[str, str] | object) -> str | None:
    auth = headers.get("Authorization") or headers.get("authorization") or ""  # type: ignore[union-attr]
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return None


def principal_for_secret(secret: str) -> Principal | None:
    """The live principal for a bearer secret (cached while fresh), or None."""
    return principals.read_through(token_hash(secret), read=lambda: _principal_read(secret), usable=_unexpired)


def _unexpired(principal: Principal) -> bool:
    expires_at = principal.token.expires_at
    return expires_at is None or expires_at > timezone.now()


def _principal_read(secret: str) -> Principal | None:
    token = token_verify(secret=secret, with_role=True)
    if token is None:
        return None
    if token.worker is not None:
        return Principal(token=token, org=token.worker.org, role=None, worker=token.worker)
    role = token.member_role  # type: ignore[attr-defined]  # annotated by token_verify(with_role=True)
    if role is None:  # removed from the organization: the token dies with the membership
        return None
    return Principal(token=token, org=token.org, role=role, worker=None)


class BearerTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request):  # type: ignore[no-untyped-def]
        secret = bearer_from_headers(request.headers)
        if secret is None:
            return None
        principal = principal_for_secret(secret)
        if principal is None:
            raise exceptions.AuthenticationFailed("invalid, expired or revoked token")
        return (principal.token.user, principal)

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="synth"'
