"""Who may do what. Members read; operators and admins write; workers only claim and report."""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from apps.accounts.principal import Principal


def _principal(request: Request) -> Principal | None:
    return request.auth if isinstance(request.auth, Principal) else None


class IsMember(BasePermission):
    """A member of an organization; viewers may only read."""

    def has_permission(self, request: Request, view: object) -> bool:
        principal = _principal(request)
        if principal is None or principal.is_worker:
            return False
        return request.method in SAFE_METHODS or principal.can_write()


class IsWorker(BasePermission):
    def has_permission(self, request: Request, view: object) -> bool:
        principal = _principal(request)
        return principal is not None and principal.is_worker
