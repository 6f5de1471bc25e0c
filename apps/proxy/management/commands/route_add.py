"""Create or update a model route: `manage.py route_add --default` for the embedded one."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.core.errors import ServiceError
from apps.proxy.adapters.registry import ADAPTERS
from apps.proxy.models import ModelRoute
from apps.proxy.routes import DEFAULT_ROUTE, route_upsert

ROUTE_FIELDS = list(DEFAULT_ROUTE)


class Command(BaseCommand):
    help = (
        "Create or update a model route by name (idempotent). With --default, the embedded default "
        f"route {DEFAULT_ROUTE['name']!r}: Qwen3 chat format, tiny local sampler, Claude model names as aliases."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", nargs="?", help="route name (what requests send as model)")
        parser.add_argument("--default", action="store_true", help="the embedded default route")
        parser.add_argument("--family", help=f"adapter family: {', '.join(sorted(ADAPTERS))}")
        parser.add_argument("--tokenizer", help="tokenizer directory name (default: the family)")
        parser.add_argument("--context-window", type=int)
        parser.add_argument("--max-output", type=int)
        parser.add_argument("--backend", help="sampler backend: local, tinker, openai, scripted, instant")
        parser.add_argument("--config", default=None, help="sampler config as JSON")
        parser.add_argument("--alias", action="append", dest="aliases", help="alias or glob (repeatable)")
        parser.add_argument("--trainable", action="store_true", default=None)
        parser.add_argument("--no-inference", action="store_true", help="register with inference disabled")

    def handle(self, *args: Any, **opts: Any) -> None:
        spec: dict[str, Any] = dict(DEFAULT_ROUTE) if opts["default"] else {}
        if opts["name"]:
            spec["name"] = opts["name"]
        existing = ModelRoute.objects.filter(name=spec.get("name")).first() if spec.get("name") else None
        if existing is not None and not opts["default"]:
            # Updating: options given replace, the rest is kept.
            spec = {field: getattr(existing, field) for field in ROUTE_FIELDS}
        for key, opt in [
            ("family", "family"),
            ("tokenizer", "tokenizer"),
            ("context_window", "context_window"),
            ("max_output", "max_output"),
            ("sampler_backend", "backend"),
            ("aliases", "aliases"),
            ("trainable", "trainable"),
        ]:
            if opts[opt] is not None:
                spec[key] = opts[opt]
        if opts["config"] is not None:
            try:
                spec["sampler_config"] = json.loads(opts["config"])
            except ValueError as exc:
                raise CommandError(f"--config is not JSON: {exc}") from exc
        if opts["no_inference"]:
            spec["inference_enabled"] = False
        spec.setdefault("tokenizer", spec.get("family"))
        missing = [k for k in ("name", "family", "context_window", "max_output", "sampler_backend") if not spec.get(k)]
        if missing:
            raise CommandError(f"missing {', '.join(missing)} (or use --default)")
        try:
            route, created = route_upsert(**spec)
        except ServiceError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(
            f"{'created' if created else 'updated'} route {route.name} ({route.family}, {route.sampler_backend})"
        )
