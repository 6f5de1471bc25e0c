"""Write the small-character-set tiny model (apps.proxy.small_models) as a checkpoint directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.proxy.small_models import DEFAULT_CHARS, small_model_provision
from apps.proxy.tokenizers import TokenizerNotProvisioned, tokenizer_load


class Command(BaseCommand):
    help = (
        "Build, offline and deterministically, a tiny Qwen3-vocabulary model that samples only single-character "
        "tokens of --chars, into --dir (a Hugging Face checkpoint directory for a local route's "
        '{"model_dir": ...}). Idempotent: a directory holding the same build is left as it is.'
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dir", dest="directory", type=Path, required=True, help="target directory")
        parser.add_argument("--chars", default=DEFAULT_CHARS, help=f"the characters it samples ({DEFAULT_CHARS})")
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args: Any, directory: Path, chars: str, seed: int, **options: Any) -> None:
        try:
            tokenizer = tokenizer_load("qwen3")
        except TokenizerNotProvisioned as exc:
            raise CommandError(str(exc)) from exc
        try:
            result = small_model_provision(directory=directory.resolve(), chars=chars, seed=seed, tokenizer=tokenizer)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"{result}: {directory.resolve()}")
