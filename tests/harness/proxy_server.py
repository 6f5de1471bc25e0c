"""The model proxy for the harness tests, as production runs it, plus a scripted chooser.

    python -m tests.harness.proxy_server --uds /path/proxy.sock     (or --port N)

It is ``uvicorn synth_project.proxy_asgi:application --uds ...`` with one addition: a scripted
route may name its chooser by module path (``{"choose": "tests.harness.script:choose"}``),
because a route's sampler config is JSON and the proxy is a separate process. The
database, broker and tokenizer directory come from the environment, as for the real proxy.
"""

from __future__ import annotations

import argparse
import os
from typing import Any


def _scripted_choosers_by_path() -> None:
    from django.utils.module_loading import import_string

    from apps.proxy.samplers import factory

    create = factory._create

    def _create(backend: str, config: dict[str, Any]) -> Any:
        if backend == "scripted" and isinstance(config.get("choose"), str):
            config = {**config, "choose": import_string(config["choose"].replace(":", "."))}
        return create(backend, config)

    factory._create = _create


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--uds", help="Unix socket path")
    where.add_argument("--port", type=int, help="TCP port on 127.0.0.1")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")
    import django

    django.setup()
    _scripted_choosers_by_path()
    import uvicorn

    from synth_project.proxy_asgi import application

    if args.uds:
        uvicorn.run(application, uds=args.uds, lifespan="off", log_level="info")
    else:
        uvicorn.run(application, host="127.0.0.1", port=args.port, lifespan="off", log_level="info")


if __name__ == "__main__":
    main()
