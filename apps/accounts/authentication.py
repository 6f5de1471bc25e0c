from __future__ import annotations

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from apps.accounts.principal import Principal
from apps.accounts.services import token_verify


def bearer_from_headers(headers: dict[str, str] | object) -> str | None:
    auth = headers.get("Authorization") or headers.get("authorization") or ""  # type: ignore[union-attr]
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return None


def principal_for_secret(secret: str) -> Principal | None:
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
