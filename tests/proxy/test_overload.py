"""Overload and abandonment: a database that refuses connections is an overload (529, retry),
never a 500; generation is admitted per route before the process; a client that goes away
stops its generation."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.db import OperationalError

from apps.proxy import calls, pool, views
from apps.proxy.errors import Overloaded
from apps.proxy.models import Delivery, Interaction
from apps.proxy.samplers.factory import sampler_build
from tests.conftest import make_member
from tests.proxy.conftest import assert_error, call, issue, make_route

pytestmark = pytest.mark.django_db


def test_database_refusal_is_an_overloaded_error():
    resp = views._reject(OperationalError("FATAL: sorry, too many clients already"), "req_1")
    assert resp.status_code == 529
    body = json.loads(resp.content)
    assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
    assert resp["retry-after"] == "2"


def test_a_route_waits_for_its_own_slots_before_the_process_slots(settings):
    settings.SYNTH_PROXY_ROUTE_LIMITS = {"slow-route": 1}
    settings.SYNTH_PROXY_ROUTE_QUEUE = 1

    async def scenario():
        process = pool.generation
        before = process.stats()
        release = asyncio.Event()
        order: list[str] = []

        async def job(ticket: pool.Ticket, name: str) -> None:
            async with ticket:
                order.append(name)
                await release.wait()

        first = asyncio.create_task(job(pool.generation_reserve(caller="a", route="slow-route"), "slow 1"))
        second = asyncio.create_task(job(pool.generation_reserve(caller="b", route="slow-route"), "slow 2"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        # The second call waits for the route, holding no process slot; a third has no place.
        assert pool.route_admission(route="slow-route").stats() == {"active": 1, "waiting": 1, "reserved": 1}
        assert process.active == before["active"] + 1
        with pytest.raises(Overloaded):
            pool.generation_reserve(caller="c", route="slow-route")
        # Another route is admitted at once.
        other = asyncio.create_task(job(pool.generation_reserve(caller="d", route="other-route"), "other"))
        await asyncio.sleep(0)
        assert order == ["slow 1", "other"]
        release.set()
        await asyncio.gather(first, second, other)
        assert order == ["slow 1", "other", "slow 2"]
        assert process.stats() == before
        assert pool.route_admission(route="slow-route").stats() == {"active": 0, "waiting": 0, "reserved": 0}

    async_to_sync(scenario)()


def test_a_full_route_is_refused_before_the_stream_starts(settings, qwen3_tokenizer):
    settings.SYNTH_PROXY_ROUTE_LIMITS = {"full-route": 1}
    settings.SYNTH_PROXY_ROUTE_QUEUE = 0
    member = make_member("team", "alice")
    make_route("full-route", backend="instant")
    holder = pool.generation_reserve(caller="someone", route="full-route")
    try:
        body = {"model": "full-route", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        # An HTTP 529 in Anthropic's shape (Claude Code retries it), not an error event after a 200.
        assert_error(call("/v1/messages", secret=issue(member.org, "full-route"), body=body), 529, "overloaded_error")
    finally:
        holder.release()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_cancels_its_generation(live_proxy, stream):
    """A client leaves the proxy's TCP listener in the middle of a long local generation: the
    model stops after the token it was computing (it is not left sampling for nobody)."""
    member = make_member("team", "alice")
    route = make_route("qwen3-local", backend="local", config={"tiny": True, "family": "qwen3", "seed": 0})
    sampler = sampler_build(backend="local", config=calls.sampler_config(route=route, snapshot=""))
    forwards = 0
    third, proceed = threading.Event(), threading.Event()

    def hook(module, args, output):  # type: ignore[no-untyped-def]
        # Hold the model inside its third step (two tokens drawn) until the client has left.
        nonlocal forwards
        forwards += 1
        if forwards == 3:
            third.set()
            proceed.wait(60)

    handle = sampler.model.register_forward_hook(hook)
    try:
        body = json.dumps(
            {
                "model": "qwen3-local",
                "max_tokens": 256,
                "stream": stream,
                "messages": [{"role": "user", "content": "hi"}],
            }
        ).encode()
        head = (
            f"POST /v1/messages HTTP/1.1\r\nHost: proxy\r\ncontent-type: application/json\r\n"
            f"x-api-key: {issue(member.org, 'qwen3-local')}\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        client = socket.create_connection(("127.0.0.1", live_proxy.port))
        client.sendall(head + body)
        assert third.wait(60), "the generation did not start"
        client.close()
        # The proxy records the call as abandoned once it has cancelled the generation.
        deadline = time.monotonic() + 60
        while not Interaction.objects.filter(delivery=Delivery.CLIENT_DISCONNECTED).exists():
            assert time.monotonic() < deadline, "the proxy never noticed the client leave"
            time.sleep(0.05)
        proceed.set()
        sampler._executor.submit(lambda: None).result(timeout=60)  # the model's thread is idle again
        assert forwards == 3  # no token after the one being computed when the client left
    finally:
        proceed.set()
        handle.remove()
