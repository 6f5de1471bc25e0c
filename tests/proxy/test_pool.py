"""Admission: bounded concurrency, bounded waiting, per-caller share; the CPU pool."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import async_to_sync

from apps.proxy.errors import Overloaded, RateLimited
from apps.proxy.pool import Admission, run_cpu


def test_limit_queue_and_refusals():
    async def scenario():
        adm = Admission(name="g", limit=2, max_waiting=1, per_caller=2)
        order: list[str] = []
        release = asyncio.Event()

        async def job(ticket, name):
            async with ticket:
                order.append(f"start {name}")
                await release.wait()
                order.append(f"end {name}")

        t1 = asyncio.create_task(job(adm.reserve(caller="a"), "1"))
        t2 = asyncio.create_task(job(adm.reserve(caller="b"), "2"))
        t3 = asyncio.create_task(job(adm.reserve(caller="c"), "3"))  # waits
        await asyncio.sleep(0.01)
        assert adm.stats() == {"active": 2, "waiting": 1, "reserved": 1}
        with pytest.raises(Overloaded):
            adm.reserve(caller="d")  # 2 running + 1 waiting: full
        with pytest.raises(RateLimited):
            Admission(name="g", limit=9, max_waiting=9, per_caller=1).reserve(caller="x").admission.reserve(caller="x")
        release.set()
        await asyncio.gather(t1, t2, t3)
        assert order.index("start 3") > order.index("start 1")
        assert adm.stats() == {"active": 0, "waiting": 0, "reserved": 0} and adm.by_caller == {}

    async_to_sync(scenario)()


def test_cancelled_waiter_gives_its_place_back():
    async def scenario():
        adm = Admission(name="g", limit=1, max_waiting=2, per_caller=5)
        hold = adm.reserve(caller="a")
        await hold.__aenter__()
        waiter = asyncio.create_task(adm.reserve(caller="a").__aenter__())
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert adm.stats() == {"active": 1, "waiting": 0, "reserved": 0}
        hold.release()
        unused = adm.reserve(caller="a")
        unused.release()
        unused.release()  # idempotent
        assert adm.stats() == {"active": 0, "waiting": 0, "reserved": 0}

    async_to_sync(scenario)()


def test_cpu_work_runs_off_the_event_loop():
    async def scenario():
        loop_thread = threading.get_ident()
        worker_thread = await run_cpu(threading.get_ident)
        assert worker_thread != loop_thread
        return await run_cpu(sum, [1, 2, 3])

    assert async_to_sync(scenario)() == 6
