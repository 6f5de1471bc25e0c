"""Short database phases of the async proxy: off the event loop, connection given back at once.

A call spends most of its life sampling and streaming; holding a PostgreSQL connection for
all of it made 200 concurrent streams exhaust the server's connections. Each phase
(authenticate, resolve, stage, settle) opens and closes its own, so connections scale with
phases in flight, not with streams open.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

_semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def db_phase(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """`fn` (a short database phase) as a coroutine function run in a thread, its
    connection closed after it (unless a transaction is open)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            if not connection.in_atomic_block:
                connection.close()

    blocking = sync_to_async(run)

    async def call(*args: Any, **kwargs: Any) -> Any:
        # Bounded: a burst of calls waits its turn instead of exceeding the database's
        # connection limit (which would fail calls rather than slow them).
        async with _slots():
            return await blocking(*args, **kwargs)

    return call


def _slots() -> asyncio.Semaphore:
    """One semaphore per event loop (a semaphore must not cross loops: tests run several)."""
    loop = asyncio.get_running_loop()
    semaphore = _semaphores.get(loop)
    if semaphore is None:
        semaphore = _semaphores[loop] = asyncio.Semaphore(settings.SYNTH_PROXY_DB_SLOTS)
    return semaphore
