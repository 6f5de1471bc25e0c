from __future__ import annotations

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from apps.accounts.models import Role
from apps.accounts.services import (
    membership_set,
    org_get_or_create,
    token_issue,
    worker_get_or_create,
    worker_token_issue,
)


class Command(BaseCommand):
    help = "Print a new API token (shown once). Creates the organization, user and membership if needed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--org", help="organization slug")
        parser.add_argument("--user", help="username")
        parser.add_argument("--role", default=Role.OPERATOR, choices=[r.value for r in Role])
        parser.add_argument(
            "--worker",
            help="issue a worker token for this worker identity instead of a user token",
        )
        parser.add_argument("--name", default="", help="a label for the token")
        parser.add_argument("--expires-days", type=int, default=None)

    def handle(self, *args: object, **opts: object) -> None:
        expires_at = timezone.now() + timedelta(days=opts["expires_days"]) if opts["expires_days"] else None
        org = org_get_or_create(slug=str(opts["org"])) if opts["org"] else None
        if opts["worker"]:
            worker = worker_get_or_create(name=str(opts["worker"]), org=org)
            issued = worker_token_issue(worker=worker, name=str(opts["name"]), expires_at=expires_at)
        else:
            if org is None or not opts["user"]:
                self.stderr.write("create_token: --org and --user are required (or --worker)")
                raise SystemExit(2)
            membership = membership_set(org=org, username=str(opts["user"]), role=str(opts["role"]))
            issued = token_issue(
                org=org,
                user=membership.user,
                name=str(opts["name"]),
                expires_at=expires_at,
            )
        self.stdout.write(issued.secret)
