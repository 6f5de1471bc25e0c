"""What a proxy process loads before it takes its first call.

A process that loads these on its first calls stalls every call it holds at the time, because
the loading holds the interpreter:
- a family's tokenizer (`tokenizers`' from_file keeps the GIL for about a second for Qwen3's);
- the URLconf, and Celery's app and broker transport (imports).
At 200 sessions, a second uvicorn worker's first calls were measured waiting 1.1 s of GIL behind
the tokenizer alone.

The proxy's ASGI lifespan startup (synth_project.proxy_asgi) runs `proxy_warm` in a thread
before the worker accepts a connection, as uvicorn runs startup before it serves. Nothing here
is required: what fails is logged and loads on first use as before (a route whose tokenizer
is not provisioned answers its callers with what to run), and a database that cannot be
reached leaves only the URLconf and Celery warmed.
"""

from __future__ import annotations

import logging

from django.db import connections
from django.urls import resolve

logger = logging.getLogger(__name__)


def proxy_warm(*, urlconf: str) -> list[str]:
    """Load what the first calls would: the proxy's URLconf (`urlconf`), the adapter (and
    tokenizer) of every family an inference-enabled route uses, Celery's app and transport.
    Returns the families loaded. Never raises: a failure is logged and the thing loads on
    first use."""
    from apps.proxy.adapters.registry import adapter_for
    from apps.proxy.models import ModelRoute

    try:
        resolve("/v1/messages", urlconf=urlconf)
    except Exception as exc:  # noqa: BLE001 - the first call reports a broken URLconf itself
        logger.warning("proxy warm-up: the URLconf did not load: %s", exc)
    families: list[str] = []
    try:
        families = sorted(set(ModelRoute.objects.filter(inference_enabled=True).values_list("family", flat=True)))
    except Exception as exc:  # noqa: BLE001 - a database that cannot answer now, however it fails
        logger.warning("proxy warm-up: the routes could not be read (%s); adapters load on first use", exc)
    finally:
        # This thread is the lifespan's, not a database phase's: its connection goes back now.
        connections.close_all()
    loaded = []
    for family in families:
        try:
            adapter_for(family)
        except Exception as exc:  # noqa: BLE001 - KeyError, TokenizerNotProvisioned: reported on first call too
            logger.warning("proxy warm-up: family %s not loaded: %s", family, exc)
        else:
            loaded.append(family)
    try:
        _celery_warm()
    except Exception as exc:  # noqa: BLE001 - an unknown transport is reported on first publish too
        logger.warning("proxy warm-up: Celery's transport not loaded: %s", exc)
    return loaded


def _celery_warm() -> None:
    """Celery's app finalized (the tasks bound) and its broker transport's class imported;
    no connection is made."""
    from apps.proxy.tasks import evidence_publish_many_task

    app = evidence_publish_many_task.app
    app.finalize(auto=True)
    connection = app.connection_for_write()
    try:
        connection.get_transport_cls()  # resolving the class imports its module
    finally:
        connection.release()
