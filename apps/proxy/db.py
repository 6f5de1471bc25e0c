"""Short database phases of the async proxy: off the event loop, on a few database threads.

A call spends most of its life sampling and streaming; holding a PostgreSQL connection for
all of it made 200 concurrent streams exhaust the server's connections. Each phase
(authenticate, resolve, stage, settle: the first two mostly answered from apps.proxy.lookups)
uses a connection only while it runs, so connections scale with phases in flight (the
slots), not with streams open.

In the proxy's process (SYNTH_PROXY_PROCESS) the phases run on the process's own database
threads, one per slot, rather than on a thread made for each request, and each thread keeps
its connection from one phase to the next (SYNTH_PROXY_DB_CONN_MAX_AGE): the process holds at
most one connection per slot, and a phase ends as a request does in Django, its connection
checked (and closed if it failed or is too old) rather than closed. The next phase's first
query checks it again by a poll of its socket (apps.core.postgresql), so a connection the
server ended meanwhile is replaced before it is used. Elsewhere (the whole app, tests) a
phase is thread-sensitive, as Django's default: it runs where the caller's synchronous code
runs (in a test, inside the test's transaction), and closing its connection closes it.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import threading
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

_slots_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, PhaseSlots] = weakref.WeakKeyDictionary()
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def db_phase(fn: Callable[..., Any], *, first: bool = False) -> Callable[..., Awaitable[Any]]:
    """`fn` (a short database phase) as a coroutine function run in a thread, its
    connection kept for the thread's next phase or closed after it (see the module's
    docstring; unless a transaction is open).

    `first`: a phase a response's first byte waits for (authenticating a caller not cached,
    reading a stale route table). Such a phase takes the next free slot ahead of those only
    a response's end waits for (staging, settling): at 200 sessions, a call whose caller was
    not cached waited behind the other calls' staging and settling, up to 200 ms, before
    it could answer anything."""

    executor = _phase_executor()

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            if connection.in_atomic_block:
                pass  # the caller's transaction (a test's): not this phase's to end
            elif executor is not None:
                connection.close_if_unusable_or_obsolete()  # kept for this thread's next phase
            else:
                connection.close()

    blocking = sync_to_async(run) if executor is None else _on_executor(run, executor=executor)

    async def call(*args: Any, **kwargs: Any) -> Any:
        # Bounded: a burst of calls waits its turn instead of exceeding the database's
        # connection limit (which would fail calls rather than slow them).
        slots = _slots()
        await slots.acquire(first=first)
        try:
            return await blocking(*args, **kwargs)
        finally:
            slots.release()

    return call


# `first` phases admitted in a row while others wait, at most: the preference must not let a
# flood of calls with unknown secrets (each a lookup that is never cached) starve the
# staging and settling of the calls already answering.
FIRST_IN_A_ROW = 4


class PhaseSlots:
    """The database slots of one event loop: at most `size` phases at once, those waiting
    admitted in order, a `first` one before the others (up to FIRST_IN_A_ROW in a row). A
    freed slot is handed to the next waiter directly, so a phase arriving meanwhile cannot
    take it first."""

    def __init__(self, *, size: int) -> None:
        self._free = size
        self._first: collections.deque[asyncio.Future[None]] = collections.deque()
        self._rest: collections.deque[asyncio.Future[None]] = collections.deque()
        self._first_in_a_row = 0

    async def acquire(self, *, first: bool = False) -> None:
        if self._free > 0 and not self._first and not self._rest:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._first if first else self._rest
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot just as it was cancelled: pass it on
            elif waiter in queue:  # not dropped by a release meanwhile
                queue.remove(waiter)
            raise

    def release(self) -> None:
        self._prune()
        if self._first and (not self._rest or self._first_in_a_row < FIRST_IN_A_ROW):
            self._first_in_a_row += 1
            self._first.popleft().set_result(None)
        elif self._rest:
            self._first_in_a_row = 0
            self._rest.popleft().set_result(None)
        else:
            self._free += 1

    def _prune(self) -> None:
        """Drop the waiters cancelled while queued from the front of both queues."""
        for queue in (self._first, self._rest):
            while queue and queue[0].done():
                queue.popleft()


def _on_executor(fn: Callable[..., Any], *, executor: ThreadPoolExecutor) -> Callable[..., Awaitable[Any]]:
    """`fn` as a coroutine function run on `executor` in a copy of the caller's context.

    What ``sync_to_async(fn, thread_sensitive=False, executor=executor)`` does for a
    function that needs nothing more: a phase's Django connection is its thread's own (the
    connection handler is thread-critical), it calls no async code back, and no context
    change it makes is wanted by the caller. asgiref's wrapper also defines three closures
    per call, their annotations evaluated each time, and restores the context around both
    ends: about 5% of the proxy's GIL time at 200 sessions, for nothing a phase uses.

    Cancelling the caller leaves a phase that has started to finish on its thread (and give
    its connection back); one still queued never starts. Callers whose write must happen
    whatever becomes of the request shield it (apps.proxy.delivery)."""

    async def call(*args: Any, **kwargs: Any) -> Any:
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(
            executor, functools.partial(context.run, fn, *args, **kwargs)
        )

    return call


def _phase_executor() -> ThreadPoolExecutor | None:
    """The proxy process's database threads (as many as its slots), or None elsewhere."""
    global _executor
    if not settings.SYNTH_PROXY_PROCESS:
        return None
    if _executor is None:
        with _executor_lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(max_workers=settings.SYNTH_PROXY_DB_SLOTS, thread_name_prefix="proxy-db")
    return _executor


def _slots() -> PhaseSlots:
    """One set of slots per event loop (their futures must not cross loops: tests run several)."""
    loop = asyncio.get_running_loop()
    slots = _slots_by_loop.get(loop)
    if slots is None:
        slots = _slots_by_loop[loop] = PhaseSlots(size=settings.SYNTH_PROXY_DB_SLOTS)
    return slots


class _Batch:
    """One event loop's state of a PhaseBatches."""

    def __init__(self) -> None:
        self.gathering: dict[Any, asyncio.Future[Any]] = {}  # the next batch, still open
        self.waiting: dict[Any, asyncio.Future[Any]] = {}  # every key not answered yet
        self.running = False  # a phase is running: it takes what gathers when it is done
        self.tasks: set[asyncio.Task[None]] = set()  # the run in progress (kept from collection)


class PhaseBatches:
    """Work that arrives one key at a time, done in batches, one batch at a time per event
    loop: ``run`` (a coroutine function: the batch's keys -> each key's result or exception)
    takes the keys of one turn of the loop, and the keys that arrive while it runs gather for
    the next batch, which the same run takes as soon as it has answered its own. Nothing
    waits to fill a batch. A key already waiting shares its answer.

    Used where per-call database phases queued for the process's few slots: the credential
    loads of calls not found cached (apps.proxy.exchange) and the settles of finished calls
    (apps.proxy.delivery). The run is a task of its own, so cancelling a caller's task does
    not stop it; cancelling the run (the loop closing) cancels every key it would have
    answered."""

    def __init__(self, *, run: Callable[[list[Any]], Awaitable[dict[Any, Any]]]) -> None:
        self.run = run
        self.by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Batch] = weakref.WeakKeyDictionary()

    def join(self, key: Any) -> asyncio.Future[Any]:
        """The future of ``key``'s answer (shield it: other callers may share it)."""
        loop = asyncio.get_running_loop()
        batch = self.by_loop.get(loop)
        if batch is None:
            batch = self.by_loop[loop] = _Batch()
        future = batch.waiting.get(key)
        if future is not None:
            return future
        if not batch.running:
            batch.running = True
            task = loop.create_task(self._run(batch))
            batch.tasks.add(task)
            task.add_done_callback(batch.tasks.discard)
        future = batch.gathering[key] = batch.waiting[key] = loop.create_future()
        # Its error is raised in every caller waiting for it; marked seen here, so that one
        # no caller waits for any more (all went away) is not reported as never retrieved.
        future.add_done_callback(lambda done: done.cancelled() or done.exception())
        return future

    async def _run(self, batch: _Batch) -> None:
        """Run batch after batch until nothing gathers; `running` is cleared in the same step
        as the last look at `gathering`, so a key either joins a batch this run takes or
        starts the next run."""
        taken: dict[Any, asyncio.Future[Any]] = {}
        try:
            await asyncio.sleep(0)  # the keys of this turn of the loop join
            while batch.gathering:
                taken, batch.gathering = batch.gathering, {}
                try:
                    results = await self.run(list(taken))
                except Exception as exc:  # noqa: BLE001 - each caller raises it
                    results = dict.fromkeys(taken, exc)
                for key, future in taken.items():
                    batch.waiting.pop(key, None)
                    result = results[key]
                    if future.done():
                        continue
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
                taken = {}
        except BaseException:  # the run itself cancelled (the loop closing): no caller waits for ever
            # Its batch and what gathered meanwhile end with it: no run would take them.
            for key, future in [*taken.items(), *batch.gathering.items()]:
                batch.waiting.pop(key, None)
                future.cancel()
            batch.gathering = {}
            raise
        finally:
            batch.running = False
