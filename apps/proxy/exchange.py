"""One model call over HTTP, the same for every wire protocol (apps.proxy.protocol).

    auth -> body (size, strict JSON) -> protocol.parse -> route context -> admission
    ticket -> prepare (render, tokenize, fit) -> sample -> stage -> answer -> settle

The protocol supplies only the translation at both ends; everything else, and what became
of the answer (delivery.py), is here once. Refusals (auth, validation, prompt too long,
admission) happen before a stream starts, so they are HTTP statuses clients act on
(Claude Code compacts on a 400 "prompt is too long" and retries 429/529; the OpenAI SDKs
retry 429/5xx), not error events after a 200. An unexpected exception is logged and
answered as a 500 in the protocol's shape, never Django's HTML page.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import OperationalError as DatabaseOperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.request import RawPostDataException
from django.http.response import HttpResponseBase

from apps.core.inputs import InputProblem, json_loads_strict
from apps.proxy import calls, lookups, pool
from apps.proxy.credentials import Caller, is_model_credential, secret_from_headers
from apps.proxy.db import PhaseBatches, db_phase
from apps.proxy.delivery import CallDelivery
from apps.proxy.errors import (
    ApiError,
    InvalidRequest,
    Overloaded,
    ProxyError,
    RequestTooLarge,
    error_response,
    new_request_id,
)
from apps.proxy.models import ModelRoute
from apps.proxy.protocol import Protocol, StreamWriter

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 1024 * 1024  # Anthropic's limit for Messages and count_tokens

SESSION_KEY_MAX = 200  # characters of a session key named in a request body

# Deeper than any tool schema or tool input; the adapters' templates and encoders recurse.
MAX_JSON_DEPTH = 128


class MethodNotAllowed(InvalidRequest):
    status = 405


def proxy_error(exc: Exception, request_id: str) -> ProxyError:
    """Any failure as the ProxyError to answer: a refused database connection is an
    overload to retry, anything unexpected a logged 500."""
    if isinstance(exc, DatabaseOperationalError):
        # The database refused a connection (pool or server limit): an overload the client
        # should retry, not a server bug.
        logger.warning("proxy request %s: database unavailable: %s", request_id, exc)
        return Overloaded("the service is overloaded; retry shortly", headers={"retry-after": "2"})
    if not isinstance(exc, ProxyError):
        logger.exception("proxy request %s failed", request_id, exc_info=exc)
        return ApiError("Internal server error")
    return exc


def reject(exc: Exception, request_id: str, *, protocol: Protocol | None = None) -> HttpResponse:
    """The error answer for `exc` in the protocol's shape (Anthropic's without one)."""
    failure = proxy_error(exc, request_id)
    if protocol is None:
        return error_response(failure, request_id=request_id)
    return protocol.error_response(failure, request_id=request_id)


def json_answer(data: Any, *, request_id: str, status: int = 200) -> JsonResponse:
    response = JsonResponse(data, status=status, json_dumps_params={"ensure_ascii": False})
    response["request-id"] = request_id
    return response


def body_read(request: HttpRequest) -> bytes:
    try:
        length = int(request.headers.get("content-length") or 0)
    except ValueError:
        length = 0
    if length > MAX_BODY_BYTES:
        raise RequestTooLarge(f"request body exceeds {MAX_BODY_BYTES} bytes")
    try:
        body = request.body
    except (RequestDataTooBig, RawPostDataException) as exc:
        raise RequestTooLarge(f"request body exceeds {MAX_BODY_BYTES} bytes") from exc
    if len(body) > MAX_BODY_BYTES:
        raise RequestTooLarge(f"request body exceeds {MAX_BODY_BYTES} bytes")
    return body


# A body up to this size is decoded and its prompt rendered on the event loop: the thread
# hop to the worker pool costs about as much interpreter time as decoding it (tens of
# microseconds), and the GIL lets the pool run no decode beside the loop anyway. Larger ones
# (Claude Code's with its tools: 100 KB and more) go to the pool, so one body cannot hold up
# every stream.
INLINE_BODY_BYTES = 32 * 1024


def json_decode(body: bytes) -> Any:
    """The body as JSON, held to the platform's input rules (apps.core.inputs): finite
    numbers, no NUL or lone surrogate in any string or key, bounded nesting."""
    if not body.strip():
        raise InvalidRequest("the request body must be a JSON object")
    try:
        return json_loads_strict(body.decode("utf-8"), max_depth=MAX_JSON_DEPTH)
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: it is not UTF-8 ({exc})") from None
    except InputProblem as exc:
        if exc.path is None:
            raise InvalidRequest(f"the request body is {exc.message}") from None
        where = ".".join(str(part) for part in exc.path)
        raise InvalidRequest(f"{where}: {exc.message}" if where else exc.message) from None


async def authenticate(request: HttpRequest) -> Caller:
    # From the process's cache when fresh (no database phase, no thread hop): apps.proxy.lookups.
    secret = secret_from_headers(request.headers)
    caller = lookups.caller_cached(secret=secret)
    if caller is not None:
        return caller
    if not is_model_credential(secret):
        return await db_phase(lookups.caller_load, first=True)(secret=secret)
    assert secret is not None  # a model credential's form
    # Shielded: a caller that goes away does not cancel the others waiting for the same load.
    return await asyncio.shield(_caller_loading(secret=secret))


async def _callers_phase(secrets: list[str]) -> dict[str, Any]:
    return await db_phase(lookups.callers_load, first=True)(secrets=secrets)


# The model credentials of one event loop not found cached, loaded together: the calls that
# miss in the same turn of the loop (a run's attempts starting at once, each with a
# credential of its own) share one database phase and one query, instead of each queueing
# its own phase for the process's few database slots. One load runs at a time: the misses
# that arrive while its phase runs gather for the next batch. When a fleet's sessions open
# over a few hundred milliseconds, each turn's misses started a load of their own before:
# tens of small phases, each waiting for a slot behind the other calls' staging and
# settling (the opening calls' wait to authenticate was p50 32-76 ms, p99 up to 230 ms at
# 200 sessions).
_CALLER_LOADS = PhaseBatches(run=_callers_phase)
_caller_loads = _CALLER_LOADS.by_loop  # each event loop's loads (tests look at them)


def _caller_loading(*, secret: str) -> asyncio.Future[Caller]:
    return _CALLER_LOADS.join(secret)


# The route table's read in flight, per event loop: the calls that find the table stale
# together (the first calls after an idle spell, a burst of sessions starting) wait for one
# read instead of each taking a database slot for the same rows.
_route_reads: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Future[Sequence[ModelRoute]]] = (
    weakref.WeakKeyDictionary()
)


async def routes_current() -> Sequence[ModelRoute]:
    routes = lookups.routes_cached()
    if routes is not None:
        return routes
    loop = asyncio.get_running_loop()
    read = _route_reads.get(loop)
    if read is None or read.done():
        read = _route_reads[loop] = asyncio.ensure_future(db_phase(lookups.routes_load, first=True)())
    # Shielded: a caller that goes away does not cancel the others' read.
    return await asyncio.shield(read)


async def lookups_tend() -> None:
    """Run forever in a proxy process (started with its server, synth_project.proxy_asgi):
    every half check interval, a database phase that caches the credentials minted lately,
    reads the route table if it is not fresh and confirms the callers in use ahead
    (lookups.lookups_keep_fresh), so the attempts' first calls and a quiet process's callers
    find what they need fresh. Nothing to do when the lookups are not cached."""
    half = settings.SYNTH_PROXY_LOOKUP_CHECK_SECONDS / 2
    if half <= 0:
        return
    tend = db_phase(lookups.lookups_keep_fresh)
    while True:
        try:
            await tend()
        except Exception:  # noqa: BLE001 - the next tick tries again; calls read what is stale
            logger.warning("proxy lookups: the timer's phase failed", exc_info=True)
        await asyncio.sleep(half)


async def context_build(
    request: HttpRequest, *, caller: Caller, model: str, request_id: str, protocol: str = "messages"
) -> calls.CallContext:
    # With the routes in hand the context reads no database: built on the event loop.
    routes = await routes_current()
    return calls.call_context_build(
        caller=caller, model=model, headers=request.headers, request_id=request_id, routes=routes, protocol=protocol
    )


async def body_parsed(request: HttpRequest, parse: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    body = body_read(request)
    if len(body) <= INLINE_BODY_BYTES:
        return parse(json_decode(body))
    # Decoding a large body is CPU work: keep it off the event loop.
    return await pool.run_cpu(lambda: parse(json_decode(body)))


# THE CALL
# ------------------------------------------------------------------------------


class _CapturedResponse(JsonResponse):
    """A JSON answer whose delivery is recorded when the server has sent it: the ASGI
    handler calls close() after the last byte (not when a client went away first)."""

    call: CallDelivery | None = None
    close_blocks = True  # it writes the database: the proxy's handler closes it in a database phase

    def close(self) -> None:
        # Settle first: super().close() fires request_finished, which may close the
        # thread's database connection.
        if self.call is not None:
            self.call.delivered_sync()
        super().close()


async def model_call(request: HttpRequest, *, protocol: Protocol) -> HttpResponseBase:
    """Serve one POST of `protocol` (see the module docstring)."""
    request_id = new_request_id()
    started = time.perf_counter()
    ticket: pool.Ticket | None = None
    try:
        if request.method != "POST":
            raise MethodNotAllowed(f"{request.method} is not allowed; use POST")
        caller = await authenticate(request)
        body = await body_parsed(request, protocol.parse)
        ctx = await context_build(
            request, caller=caller, model=body["model"], request_id=request_id, protocol=protocol.name
        )
        if session := protocol.session_key(body):
            ctx = dataclasses.replace(ctx, session_id=session[:SESSION_KEY_MAX])
        ticket = pool.generation_reserve(caller=caller.key, route=ctx.route.name)
        prepared = await calls.message_prepare(ctx=ctx, request=body, small=len(request.body) <= INLINE_BODY_BYTES)
    except BaseException as exc:  # noqa: BLE001 - every failure answers in the protocol's shape
        if ticket is not None:
            ticket.release()
        if not isinstance(exc, Exception):  # cancelled (the client left): nothing to answer
            raise
        return reject(exc, request_id, protocol=protocol)
    response_id = protocol.response_id()
    if prepared.max_tokens == 0:  # cache pre-warm: nothing to sample
        ticket.release()
        if not body["stream"]:
            answer = json_answer(
                protocol.body(response_id=response_id, prepared=prepared, completion=None), request_id=request_id
            )
            return _tagged(answer, request_id, protocol)
        events = _empty_stream(protocol.stream(response_id=response_id, prepared=prepared))
        return _tagged(sse_response(events, request_id), request_id, protocol)
    if body["stream"]:
        events = _event_stream(protocol.stream(response_id=response_id, prepared=prepared), prepared, ticket, started)
        # A stream never iterated (the client left before the response started) runs none
        # of its code, not even `finally`: give the admission slot back when it is dropped.
        weakref.finalize(events, ticket.release)
        return _tagged(sse_response(events, request_id), request_id, protocol)
    delivery = CallDelivery(prepared=prepared)
    try:
        completion = await calls.message_sample(prepared=prepared, ticket=ticket)
    except asyncio.CancelledError:
        await delivery.abandon()
        raise
    except Exception as exc:  # noqa: BLE001
        await delivery.fail(error=str(exc) or type(exc).__name__)
        return reject(exc, request_id, protocol=protocol)
    finally:
        ticket.release()
    try:
        # Staged before the JSON goes out.
        await delivery.stage(completion=completion, total_ms=(time.perf_counter() - started) * 1000)
    except asyncio.CancelledError:
        await delivery.abandon()
        raise
    response = _CapturedResponse(
        protocol.body(response_id=response_id, prepared=prepared, completion=completion),
        json_dumps_params={"ensure_ascii": False},
    )
    response["request-id"] = request_id
    response.call = delivery
    return _tagged(response, request_id, protocol)


def _tagged(response: HttpResponseBase, request_id: str, protocol: Protocol) -> HttpResponseBase:
    for name in protocol.request_id_headers:
        response[name] = request_id
    return response


def sse_response(events: AsyncIterator[bytes], request_id: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(events, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # reverse proxies must not buffer the stream
    response["request-id"] = request_id
    return response


async def _empty_stream(writer: StreamWriter) -> AsyncIterator[bytes]:
    yield b"".join(writer.start())
    yield b"".join(writer.empty())


async def _event_stream(
    writer: StreamWriter, prepared: calls.Prepared, ticket: pool.Ticket, started: float
) -> AsyncIterator[bytes]:
    """The opening events at once, keepalives while waiting for a slot and the sampler,
    then the answer; the interaction is staged before the first content event (so before
    the last event) and settled after the last event went out or when the client left."""
    delivery: CallDelivery | None = None
    task: asyncio.Task[calls.Completion] | None = None
    try:
        # Events known together go out as one chunk: one send through the server and one
        # socket write instead of one per event (the client reads the same bytes).
        yield b"".join(writer.start())
        delivery = CallDelivery(prepared=prepared)
        task = asyncio.ensure_future(calls.message_sample(prepared=prepared, ticket=ticket))
        while True:
            done, _ = await asyncio.wait({task}, timeout=settings.SYNTH_PROXY_PING_SECONDS)
            if done:
                break
            yield writer.keepalive()
        try:
            completion = task.result()
        except Exception as exc:  # noqa: BLE001 - after a 200 the error is an event
            if not isinstance(exc, ProxyError):
                logger.exception("sampling failed for %s", prepared.ctx.request_id)
                exc = ApiError("Internal server error")
            await delivery.fail(error=exc.message)
            yield b"".join(writer.error(exc))
            return
        try:
            await delivery.stage(completion=completion, total_ms=(time.perf_counter() - started) * 1000)
        except Exception:  # noqa: BLE001
            # No evidence, no answer: a response is only completed once it is staged.
            logger.exception("could not stage the interaction of %s", prepared.ctx.request_id)
            yield b"".join(writer.error(ApiError("Internal server error")))
            return
        yield b"".join(writer.completion(completion))
        # Resumed only once the server has sent the last event: the response is delivered.
        await delivery.delivered()
    finally:
        # Reached before the delivery is final when the client went away (cancellation or
        # the generator being closed at a yield).
        if task is not None and not task.done():
            task.cancel()
        ticket.release()
        if delivery is not None:
            await delivery.abandon()
