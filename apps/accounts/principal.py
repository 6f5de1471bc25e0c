"""Who is calling: the object set as `request.auth` by bearer authentication."""

from __future__ import annotations

from dataclasses import dataclass

from apps.accounts.models import ApiToken, Organization, Role, WorkerIdentity


@dataclass(frozen=True)
class Principal:
    token: ApiToken
    org: Organization | None  # None only for a platform worker
    role: str | None  # a member's role; None for workers
    worker: WorkerIdentity | None

    @property
    def is_worker(self) -> bool:
        return self.worker is not None

    def can_write(self) -> bool:
        return self.role in (Role.ADMIN, Role.OPERATOR)
