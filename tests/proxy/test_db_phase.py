"""The proxy process's database phases (apps.proxy.db): on the process's own database
threads, in the caller's context, bounded by the slots; a cancelled caller never leaves a
phase half-run nor a slot taken."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from apps.proxy import db

REQUEST = contextvars.ContextVar("request", default="")


@pytest.fixture
def proxy_phases(settings, monkeypatch):
    """The proxy process's phases, with ``slots`` database threads."""

    def configure(*, slots: int) -> None:
        settings.SYNTH_PROXY_PROCESS = True
        settings.SYNTH_PROXY_DB_SLOTS = slots
        monkeypatch.setattr(db, "_executor", None)  # made again with these settings

    yield configure
    if db._executor is not None:
        db._executor.shutdown(wait=True)


def test_a_phase_runs_on_a_database_thread_in_the_callers_context(proxy_phases):
    proxy_phases(slots=4)

    def phase(*, number: int) -> tuple[str, str, int]:
        return threading.current_thread().name, REQUEST.get(), number

    async def main() -> list[tuple[str, str, int]]:
        async def one(n: int) -> tuple[str, str, int]:
            REQUEST.set(f"req-{n}")  # each task's own context
            return await db.db_phase(phase)(number=n)

        return await asyncio.gather(*(one(n) for n in range(8)))

    results = asyncio.run(main())
    assert [(request, number) for _, request, number in results] == [(f"req-{n}", n) for n in range(8)]
    assert all(name.startswith("proxy-db") for name, _, _ in results)
    assert len({name for name, _, _ in results}) <= 4


def test_a_phase_error_reaches_its_caller(proxy_phases):
    proxy_phases(slots=2)

    def phase() -> None:
        raise LookupError("no such row")

    with pytest.raises(LookupError, match="no such row"):
        asyncio.run(db.db_phase(phase)())


def test_a_cancelled_caller_lets_a_started_phase_finish_and_a_waiting_one_never_start(proxy_phases):
    proxy_phases(slots=1)
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def slow() -> None:
        started.set()
        release.wait(timeout=30)
        ran.append("slow")

    def quick(*, name: str) -> str:
        ran.append(name)
        return name

    async def main() -> str:
        running = asyncio.ensure_future(db.db_phase(slow)())
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
        waiting = asyncio.ensure_future(db.db_phase(quick)(name="waiting"))
        await asyncio.sleep(0)  # it waits for the only slot
        waiting.cancel()
        running.cancel()
        for task in (waiting, running):
            with pytest.raises(asyncio.CancelledError):
                await task
        release.set()
        # The slot is free again: a later phase runs (after the started one, on the one thread).
        return await db.db_phase(quick)(name="later")

    assert asyncio.run(main()) == "later"
    assert ran == ["slow", "later"]


def test_a_phase_the_first_byte_waits_for_is_admitted_before_earlier_ones(proxy_phases):
    """Staging and settling queue behind each other; a caller's authentication (first=True)
    takes the next free slot ahead of them, whenever it arrived."""
    proxy_phases(slots=1)
    started, release = threading.Event(), threading.Event()
    order: list[str] = []

    def hold() -> None:
        started.set()
        release.wait(timeout=30)

    def phase(*, name: str) -> None:
        order.append(name)

    async def main() -> None:
        holding = asyncio.ensure_future(db.db_phase(hold)())
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
        queued = [asyncio.ensure_future(db.db_phase(phase)(name=f"settle-{n}")) for n in range(3)]
        await asyncio.sleep(0)  # the settles wait for the only slot, in order
        first = asyncio.ensure_future(db.db_phase(phase, first=True)(name="authenticate"))
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(holding, first, *queued)

    asyncio.run(main())
    assert order == ["authenticate", "settle-0", "settle-1", "settle-2"]


@pytest.mark.parametrize("handed", [True, False])
def test_a_cancelled_waiter_never_loses_a_slot(handed):
    """A freed slot goes to the next waiter directly. If that waiter is cancelled after the
    slot was handed to it (`handed`) it passes the slot on; if it is cancelled while still
    queued, the release skips it. Either way the later waiter runs, the cancelled one ends
    cancelled, and every slot comes back."""
    slots = db.PhaseSlots(size=1)

    async def main() -> list[str]:
        got: list[str] = []
        await slots.acquire()

        async def waiter(name: str) -> None:
            await slots.acquire()
            got.append(name)
            slots.release()

        a = asyncio.ensure_future(waiter("a"))
        b = asyncio.ensure_future(waiter("b"))
        await asyncio.sleep(0)  # both wait
        if handed:
            slots.release()  # handed to a, which has not resumed yet
            a.cancel()
        else:
            a.cancel()  # its future is cancelled now; the task resumes later
            slots.release()  # drops a, hands the slot to b
        with pytest.raises(asyncio.CancelledError):
            await a
        await b
        await slots.acquire()  # every slot came back
        return got

    assert asyncio.run(main()) == ["b"]


def test_first_phases_cannot_starve_the_others():
    """However many `first` phases keep arriving (calls with secrets that are never cached),
    a waiting staging or settling phase is admitted after at most FIRST_IN_A_ROW of them."""
    slots = db.PhaseSlots(size=1)
    admitted: list[str] = []

    async def main() -> None:
        await slots.acquire()

        async def phase(name: str, *, first: bool) -> None:
            await slots.acquire(first=first)
            admitted.append(name)
            slots.release()

        tasks = [asyncio.ensure_future(phase("settle", first=False))]
        tasks += [asyncio.ensure_future(phase(f"lookup-{n}", first=True)) for n in range(10)]
        await asyncio.sleep(0)  # all wait for the one slot
        slots.release()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert admitted.index("settle") == db.FIRST_IN_A_ROW, admitted
    assert len(admitted) == 11
