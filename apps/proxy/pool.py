"""CPU work off the event loop, and admission for generation and token counting.

Worker pool. Rendering a chat template (Jinja, Python), tokenizing (Rust, `tokenizers`)
and parsing sampled ids are CPU work that would stall every other stream if run on the
event loop. They run in one bounded ThreadPoolExecutor per process. A thread pool (not a
process pool) is deliberate: the Rust tokenizer releases the GIL while it encodes, which
is the bulk of the work for long prompts; adapters, tokenizers and the prefix cache live
in memory once per process instead of once per child; and there is no pickling of 100 KB
requests and 30k-id lists across processes. Jinja rendering does hold the GIL, so the
pool size defaults to the number of CPUs; scale proxies by processes/replicas.

Admission. Generation (a sampler call: slow, capacity-bound) and token counting (fast,
CPU-bound, called in bursts by Claude Code's /context) have SEPARATE admissions, so a
burst of counts never queues behind long generations and the reverse. Each admission is
an asyncio semaphore with a bounded waiting line:

* a full line is 529 overloaded_error (the server is at capacity; Claude Code retries);
* one caller (credential or token) holding more than its share is 429 rate_limit_error
  with retry-after, so a runaway agent cannot starve the others.

Generation is admitted twice: by its route (SYNTH_PROXY_ROUTE_CONCURRENCY / _QUEUE, or the
route's entry in SYNTH_PROXY_ROUTE_LIMITS), then by the process. A call waits for its route's
slot before it takes a process slot, so a slow backend's queue holds none of the slots the
other routes need, and a route whose line is full is refused (529) on its own.

Slots are reserved synchronously (`reserve`) before any byte is streamed, so a refusal is
an HTTP status, not an error event after a 200; the wait for the slot happens later.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings

from apps.proxy.errors import Overloaded, RateLimited

_executor: ThreadPoolExecutor | None = None


def executor() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=settings.SYNTH_PROXY_CPU_WORKERS, thread_name_prefix="proxy-cpu")
    return _executor


async def run_cpu[T](fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run CPU-bound fn in the worker pool and await its result."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor(), functools.partial(fn, *args, **kwargs))


class Admission:
    """A counting semaphore with a bounded waiting line and a per-caller limit.

    Not asyncio.Semaphore: that one binds to the first event loop that waits on it, and
    it cannot refuse synchronously when its line is full. Waiters are futures of their
    own loop, woken thread-safely, so the object may be shared by loops (tests).
    """

    def __init__(self, *, name: str, limit: int, max_waiting: int, per_caller: int) -> None:
        self.name = name
        self.limit = limit
        self.max_waiting = max_waiting
        self.per_caller = per_caller
        self.active = 0
        self.waiting: deque[asyncio.Future[None]] = deque()
        self.reserved = 0  # reserved but not yet running (waiting or about to)
        self.by_caller: dict[str, int] = {}

    def reserve(self, *, caller: str) -> Ticket:
        """Reserve a place (running or waiting) or refuse now: 429 or 529."""
        if self.by_caller.get(caller, 0) >= self.per_caller:
            raise RateLimited(
                f"too many concurrent {self.name} requests for this credential (limit {self.per_caller})",
                headers={"retry-after": "1"},
            )
        if self.reserved + self.active >= self.limit + self.max_waiting:
            raise Overloaded("Overloaded")
        self.reserved += 1
        self.by_caller[caller] = self.by_caller.get(caller, 0) + 1
        return Ticket(self, caller)

    def _wake_next(self) -> None:
        while self.waiting and self.active < self.limit:
            fut = self.waiting.popleft()
            if fut.done():  # its waiter was cancelled
                continue
            self.active += 1
            fut.get_loop().call_soon_threadsafe(_resolve, fut)

    def stats(self) -> dict[str, int]:
        return {"active": self.active, "waiting": len(self.waiting), "reserved": self.reserved}


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Ticket:
    """A reserved place; `async with ticket:` waits for the slot and releases it after."""

    def __init__(self, admission: Admission, caller: str, *, then: Ticket | None = None) -> None:
        self.admission = admission
        self.caller = caller
        self.state = "reserved"  # -> running -> released
        self.waited_ms = 0.0
        # A second admission entered once this one's slot is held (a route's ticket, then
        # the process's), and released with it.
        self.then = then

    async def __aenter__(self) -> Ticket:
        adm = self.admission
        loop = asyncio.get_running_loop()
        started = loop.time()
        if adm.active < adm.limit and not adm.waiting:
            adm.active += 1
        else:
            fut: asyncio.Future[None] = loop.create_future()
            adm.waiting.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut in adm.waiting:
                    adm.waiting.remove(fut)
                else:
                    adm.active -= 1  # a slot was handed over as we were cancelled: give it back
                self.release()
                raise
        adm.reserved -= 1
        self.state = "running"
        if self.then is not None:
            try:
                await self.then.__aenter__()
            except BaseException:
                self.release()
                raise
        self.waited_ms = (loop.time() - started) * 1000
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Give back the place, running or not (idempotent)."""
        adm = self.admission
        if self.then is not None:
            self.then.release()
        if self.state == "released":
            return
        if self.state == "running":
            adm.active -= 1
        else:
            adm.reserved -= 1
        self.state = "released"
        left = adm.by_caller.get(self.caller, 1) - 1
        if left <= 0:
            adm.by_caller.pop(self.caller, None)
        else:
            adm.by_caller[self.caller] = left
        adm._wake_next()


# Built when the module is first imported, from the settings of that moment (SYNTH_PROXY_*).
generation = Admission(
    name="generation",
    limit=settings.SYNTH_PROXY_GENERATION_CONCURRENCY,
    max_waiting=settings.SYNTH_PROXY_GENERATION_QUEUE,
    per_caller=settings.SYNTH_PROXY_PER_CALLER_CONCURRENCY,
)


def route_admission(*, route: str) -> Admission:
    """The generation admission of one route in this process, built on its first call from
    the settings of that moment. Its callers are limited by the process admission already."""
    adm = _routes.get(route)
    if adm is None:
        limit = settings.SYNTH_PROXY_ROUTE_LIMITS.get(route, settings.SYNTH_PROXY_ROUTE_CONCURRENCY)
        queue = settings.SYNTH_PROXY_ROUTE_QUEUE
        adm = _routes.setdefault(
            route, Admission(name=f"generation on {route}", limit=limit, max_waiting=queue, per_caller=limit + queue)
        )
    return adm


def generation_reserve(*, caller: str, route: str) -> Ticket:
    """Reserve a generation place on ``route`` and in the process, or refuse now (429, 529).

    The ticket waits for the route's slot first, then the process's, and gives back both."""
    route_ticket = route_admission(route=route).reserve(caller=caller)
    try:
        route_ticket.then = generation.reserve(caller=caller)
    except BaseException:
        route_ticket.release()
        raise
    return route_ticket


_routes: dict[str, Admission] = {}
counting = Admission(
    name="count_tokens",
    limit=settings.SYNTH_PROXY_COUNT_CONCURRENCY,
    max_waiting=settings.SYNTH_PROXY_COUNT_QUEUE,
    per_caller=max(settings.SYNTH_PROXY_PER_CALLER_CONCURRENCY, settings.SYNTH_PROXY_COUNT_CONCURRENCY),
)
