"""Database phases of long-lived processes that must outlive a database restart.

A worker holds its connection across a task that may run for hours. When the server
restarts (or a failover moves it), that connection is dead and the next query fails; an
idempotent write is then worth repeating on a new connection instead of losing its work.
``db_retry`` does that for a bounded time (SYNTH_DB_RETRY_SECONDS); ``db_fresh`` is the
cheap check before each phase. ``db_side_run`` serves threads that come and go with a
connection that stays.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

logger = logging.getLogger(__name__)

# What a restarted, unreachable or failing-over server raises (a refused or dropped
# connection, "terminating connection due to administrator command", a write on a closed
# connection). Errors in the statements themselves are not retried.
TRANSIENT_DB_ERRORS = (OperationalError, InterfaceError)


def db_fresh(*, check: bool = True) -> None:
    """Drop this thread's connection if an error broke it or it is past its age, so the
    next query opens a live one. A no-op inside a transaction (the caller's to handle).

    A kept connection is then pinged (Django's health check, a round trip) before its next
    query. ``check=False`` leaves the ping out, for a caller that repeats the phase on a new
    connection when the kept one turns out dead (db_retry): a trial's phases made seven
    pings, two of them between a freed slot and the next trial's start."""
    if not connection.in_atomic_block:
        close_old_connections()
        if not check and connection.connection is not None:
            connection.health_check_done = True  # type: ignore[attr-defined]  # set by Django, absent from its stubs


def _log_retry(what: str) -> Callable[[RetryCallState], None]:
    def log(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        logger.warning("%s: database unavailable (%s); retrying (attempt %d)", what, exc, state.attempt_number)

    return log


def db_retry[T](
    *,
    write: Callable[[], T],
    what: str,
    committed: Callable[[], bool] | None = None,
    seconds: float | None = None,
) -> T | None:
    """Run ``write``, an idempotent database phase, on a live connection; on a transient
    error, reconnect and run it again with backoff, for ``seconds`` at most (default
    SYNTH_DB_RETRY_SECONDS), then raise the last error.

    ``committed`` answers, before a repeat, whether the failed attempt had committed after
    all (the connection died after the server took the COMMIT): then the write is done and
    None is returned. Inside a transaction, ``write`` runs once: a retry cannot repair the
    caller's broken transaction."""
    if connection.in_atomic_block:
        return write()
    retrying = Retrying(
        retry=retry_if_exception_type(TRANSIENT_DB_ERRORS),
        wait=wait_exponential_jitter(initial=0.1, max=2.0),
        stop=stop_after_delay(settings.SYNTH_DB_RETRY_SECONDS if seconds is None else seconds),
        before_sleep=_log_retry(what),
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                # A first attempt goes ahead on the kept connection unpinged: if the server
                # ended it, the phase's first statement fails before anything commits, and
                # the repeat runs on a checked (or new) connection.
                db_fresh(check=attempt.retry_state.attempt_number > 1)
                if attempt.retry_state.attempt_number > 1 and committed is not None and committed():
                    logger.info("%s: the earlier attempt had committed", what)
                    return None
                return write()
    except TRANSIENT_DB_ERRORS:
        db_fresh()  # the caller's next query opens a new connection rather than hit this broken one
        raise
    raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover


# The process' side threads (db_side_run), one per lane, each made on first use. A forked
# child has none of its parent's threads: it makes its own.
_SIDE_THREAD = "db-side"
_sides: dict[str, ThreadPoolExecutor] = {}
_sides_lock = threading.Lock()


os.register_at_fork(after_in_child=_sides.clear)


def _side_call[T](call: Callable[[], T]) -> T:
    db_fresh()
    try:
        return call()
    finally:
        # Past its age (at once when SYNTH_DB_CONN_MAX_AGE is 0, as a request's would be) or
        # broken, the connection is closed now rather than kept idle until the next call.
        db_fresh()


def db_side_run[T](*, call: Callable[[], T], lane: str) -> T:
    """Run ``call``, short database work, on this process' side thread for ``lane`` and
    return (or raise) what it does.

    For threads that come and go, such as a trial's lease keeper: a new thread's first query
    opens a connection of its own, a PostgreSQL backend started, authenticated and warmed
    only to be closed with the thread (1.4 of them per trial on bench/trials_throughput.py).
    A side thread keeps its connection between calls as SYNTH_DB_CONN_MAX_AGE allows,
    checked before each call. A lane's calls run one at a time, in the order they came, so
    work that may wait long (a retried write) gets a lane of its own: a heartbeat must not
    queue behind it."""
    current = threading.current_thread().name
    if current.startswith(f"{_SIDE_THREAD}-{lane}_"):
        return _side_call(call)  # a call from the lane's own thread: waiting for itself would never end
    with _sides_lock:
        side = _sides.get(lane)
        if side is None:
            side = _sides[lane] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{_SIDE_THREAD}-{lane}")
    return side.submit(_side_call, call).result()


def database_answers() -> None:
    """One round trip to the database (a health check's): raises if it cannot answer."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
