"""python manage.py import_dataset --org ORG --name NAME --version V PATH (folder or registry.json)."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.accounts.models import Organization
from apps.core.errors import ServiceError
from apps.datasets.services import dataset_import_path


class Command(BaseCommand):
    help = (
        "Import a folder of Harbor task folders, or a Harbor registry.json (local task paths), "
        "as the immutable dataset version ORG/NAME@VERSION."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: object) -> CommandParser:
        # --version names the dataset version, as in `synth dataset push`; Django's own
        # --version (print Django's version) is replaced rather than clashing with it.
        kwargs.setdefault("conflict_handler", "resolve")
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--org", required=True, help="organization slug (must exist)")
        parser.add_argument("--name", required=True, help="dataset name")
        parser.add_argument("--version", required=True, dest="dataset_version", help="dataset version label")
        parser.add_argument("path", help="folder of task folders, or a registry.json file")

    def handle(self, *args: object, **opts: object) -> None:
        slug = str(opts["org"])
        org = Organization.objects.filter(slug=slug).first()
        if org is None:
            raise CommandError(f"no organization {slug!r} (create_token --org {slug} ... creates one)")
        path = Path(str(opts["path"]))
        if not path.exists():
            raise CommandError(f"{path}: no such file or folder")
        try:
            dataset_version, created = dataset_import_path(
                org=org, name=str(opts["name"]), version=str(opts["dataset_version"]), path=path
            )
        except ServiceError as exc:
            raise CommandError(exc.message) from None
        verb = "imported" if created else "already present (same digest)"
        self.stdout.write(
            f"{dataset_version.reference} {verb}: {dataset_version.task_count} tasks, digest {dataset_version.digest}"
        )
        for entry in dataset_version.entries.select_related("task_version").order_by("position"):
            tv = entry.task_version
            self.stdout.write(f"  {entry.position:>3} {tv.id} {tv.name} {tv.digest[:12]}")
