"""The /v1 endpoints in Anthropic's wire format (async views, served by ASGI/uvicorn).

    POST /v1/messages               (?beta=true accepted) streaming SSE or one JSON message
    POST /v1/messages/count_tokens  {"input_tokens": N}, exact, with the model's tokenizer
    GET  /v1/models[/<id>]          the routes this caller may use

Thin: read HTTP, run the call pipeline (calls.py), write HTTP/SSE; what became of an
answer is recorded by delivery.py. Every failure is an Anthropic-shaped error
(apps.proxy.errors); an unexpected exception is logged and answered 500 api_error rather
than Django's HTML page. Refusals (auth, validation, prompt too long, admission) happen
before the stream starts, so they are HTTP statuses Claude Code acts on (it compacts on a
400 "prompt is too long", retries 429/529), not error events after a 200.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import OperationalError as DatabaseOperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.request import RawPostDataException
from django.views.decorators.csrf import csrf_exempt

from apps.core.ids import new_id
from apps.core.inputs import InputProblem, json_loads_strict
from apps.proxy import calls, lookups, pool, schema, streaming
from apps.proxy.credentials import Caller, secret_from_headers
from apps.proxy.db import db_phase
from apps.proxy.delivery import CallDelivery
from apps.proxy.errors import (
    ApiError,
    InvalidRequest,
    NotFound,
    Overloaded,
    ProxyError,
    RequestTooLarge,
    error_response,
    new_request_id,
)
from apps.proxy.models import ModelRoute
from apps.proxy.routes import routes_for_caller

logger = logging.getLogger(__name__)


MAX_BODY_BYTES = 32 * 1024 * 1024  # Anthropic's limit for Messages and count_tokens


class MethodNotAllowed(InvalidRequest):
    status = 405


def _reject(exc: Exception, request_id: str) -> HttpResponse:
    if isinstance(exc, DatabaseOperationalError):
        # The database refused a connection (pool or server limit): an overload the client
        # should retry, not a server bug.
        logger.warning("proxy request %s: database unavailable: %s", request_id, exc)
        exc = Overloaded("the service is overloaded; retry shortly", headers={"retry-after": "2"})
    if not isinstance(exc, ProxyError):
        logger.exception("proxy request %s failed", request_id, exc_info=exc)
        exc = ApiError("Internal server error")
    return error_response(exc, request_id=request_id)


def _json(data: Any, *, request_id: str, status: int = 200) -> JsonResponse:
    response = JsonResponse(data, status=status, json_dumps_params={"ensure_ascii": False})
    response["request-id"] = request_id
    return response


def _read_body(request: HttpRequest) -> bytes:
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


# Deeper than any tool schema or tool input; the adapters' templates and encoders recurse.
MAX_JSON_DEPTH = 128


def _decode_json(body: bytes) -> Any:
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


async def _authenticate(request: HttpRequest) -> Caller:
    # From the process's cache when fresh (no database phase, no thread hop): apps.proxy.lookups.
    secret = secret_from_headers(request.headers)
    return lookups.caller_cached(secret=secret) or await db_phase(lookups.caller_load)(secret=secret)


async def _routes() -> Sequence[ModelRoute]:
    return lookups.routes_cached() or await db_phase(lookups.routes_load)()


async def _context(request: HttpRequest, *, caller: Caller, model: str, request_id: str) -> calls.CallContext:
    # With the routes in hand the context reads no database: built on the event loop.
    routes = await _routes()
    return calls.call_context_build(
        caller=caller, model=model, headers=request.headers, request_id=request_id, routes=routes
    )


async def _parsed(request: HttpRequest, parse: Any) -> dict[str, Any]:
    body = _read_body(request)
    # Decoding a large body is CPU work: keep it off the event loop.
    return await pool.run_cpu(lambda: parse(_decode_json(body)))


# POST /v1/messages
# ------------------------------------------------------------------------------


class _CapturedResponse(JsonResponse):
    """A JSON message whose delivery is recorded when the server has sent it: the ASGI
    handler calls close() after the last byte (not when a client went away first)."""

    call: CallDelivery | None = None

    def close(self) -> None:
        # Settle first: super().close() fires request_finished, which may close the
        # thread's database connection.
        if self.call is not None:
            self.call.delivered_sync()
        super().close()


@csrf_exempt
async def messages_view(request: HttpRequest) -> HttpResponse:
    request_id = new_request_id()
    started = time.perf_counter()
    ticket: pool.Ticket | None = None
    try:
        if request.method != "POST":
            raise MethodNotAllowed(f"{request.method} is not allowed; use POST")
        caller = await _authenticate(request)
        body = await _parsed(request, schema.messages_request_parse)
        ctx = await _context(request, caller=caller, model=body["model"], request_id=request_id)
        ticket = pool.generation_reserve(caller=caller.key, route=ctx.route.name)
        prepared = await calls.message_prepare(ctx=ctx, request=body)
    except BaseException as exc:  # noqa: BLE001 - every failure answers in Anthropic's shape
        if ticket is not None:
            ticket.release()
        if not isinstance(exc, Exception):  # cancelled (the client left): nothing to answer
            raise
        return _reject(exc, request_id)
    message_id = new_id("msg")
    if prepared.max_tokens == 0:  # cache pre-warm: nothing to sample
        ticket.release()
        body_zero = calls.message_body(message_id=message_id, prepared=prepared, completion=None)
        if not body["stream"]:
            return _json(body_zero, request_id=request_id)
        return _sse_response(_zero_stream(body_zero), request_id=request_id)
    if body["stream"]:
        events = _event_stream(prepared, ticket, message_id, started)
        # A stream never iterated (the client left before the response started) runs none
        # of its code, not even `finally`: give the admission slot back when it is dropped.
        weakref.finalize(events, ticket.release)
        return _sse_response(events, request_id=request_id)
    delivery = CallDelivery(prepared=prepared)
    try:
        completion = await calls.message_sample(prepared=prepared, ticket=ticket)
    except asyncio.CancelledError:
        await delivery.abandon()
        raise
    except Exception as exc:  # noqa: BLE001
        await delivery.fail(error=str(exc) or type(exc).__name__)
        return _reject(exc, request_id)
    finally:
        ticket.release()
    try:
        # Staged before the JSON goes out.
        await delivery.stage(completion=completion, total_ms=(time.perf_counter() - started) * 1000)
    except asyncio.CancelledError:
        await delivery.abandon()
        raise
    response = _CapturedResponse(
        calls.message_body(message_id=message_id, prepared=prepared, completion=completion),
        json_dumps_params={"ensure_ascii": False},
    )
    response["request-id"] = request_id
    response.call = delivery
    return response


def _sse_response(events: AsyncIterator[bytes], *, request_id: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(events, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # reverse proxies must not buffer the stream
    response["request-id"] = request_id
    return response


async def _zero_stream(body: dict[str, Any]) -> AsyncIterator[bytes]:
    yield streaming.message_start(message_id=body["id"], model=body["model"], usage=body["usage"])
    for event in streaming.message_end(stop_reason="max_tokens", stop_sequence=None, usage=body["usage"]):
        yield event


async def _event_stream(
    prepared: calls.Prepared, ticket: pool.Ticket, message_id: str, started: float
) -> AsyncIterator[bytes]:
    """message_start at once, pings while waiting for a slot and the sampler, then the
    parsed blocks; the interaction is staged before the first content event (so before
    message_stop) and settled after message_stop went out or when the client left."""
    input_tokens = len(prepared.fitted.rendered.token_ids)
    delivery: CallDelivery | None = None
    task: asyncio.Task[calls.Completion] | None = None
    try:
        yield streaming.message_start(
            message_id=message_id,
            model=prepared.ctx.model_requested,
            usage=calls.usage(input_tokens=input_tokens, output_tokens=0),
        )
        delivery = CallDelivery(prepared=prepared)
        task = asyncio.ensure_future(calls.message_sample(prepared=prepared, ticket=ticket))
        while True:
            done, _ = await asyncio.wait({task}, timeout=settings.SYNTH_PROXY_PING_SECONDS)
            if done:
                break
            yield streaming.ping()
        try:
            completion = task.result()
        except Exception as exc:  # noqa: BLE001 - after a 200 the error is an event
            if not isinstance(exc, ProxyError):
                logger.exception("sampling failed for %s", prepared.ctx.request_id)
                exc = ApiError("Internal server error")
            await delivery.fail(error=exc.message)
            yield streaming.error_event(error_type=exc.error_type, message=exc.message)
            return
        try:
            await delivery.stage(completion=completion, total_ms=(time.perf_counter() - started) * 1000)
        except Exception:  # noqa: BLE001
            # No evidence, no answer: a response is only completed once it is staged.
            logger.exception("could not stage the interaction of %s", prepared.ctx.request_id)
            yield streaming.error_event(error_type="api_error", message="Internal server error")
            return
        for index, block in enumerate(completion.blocks):
            for event in streaming.block_events(index=index, block=block):
                yield event
        end_usage = calls.usage(input_tokens=input_tokens, output_tokens=completion.delivered_ids)
        for event in streaming.message_end(
            stop_reason=completion.stop_reason, stop_sequence=completion.stop_sequence, usage=end_usage
        ):
            yield event
        # Resumed only once the server has sent message_stop: the response is delivered.
        await delivery.delivered()
    finally:
        # Reached before the delivery is final when the client went away (cancellation or
        # the generator being closed at a yield).
        if task is not None and not task.done():
            task.cancel()
        ticket.release()
        if delivery is not None:
            await delivery.abandon()


# POST /v1/messages/count_tokens
# ------------------------------------------------------------------------------


@csrf_exempt
async def count_tokens_view(request: HttpRequest) -> HttpResponse:
    request_id = new_request_id()
    try:
        if request.method != "POST":
            raise MethodNotAllowed(f"{request.method} is not allowed; use POST")
        caller = await _authenticate(request)
        body = await _parsed(request, schema.count_tokens_request_parse)
        ctx = await _context(request, caller=caller, model=body["model"], request_id=request_id)
        async with pool.counting.reserve(caller=caller.key):
            count = await calls.tokens_count(ctx=ctx, request=body)
    except Exception as exc:  # noqa: BLE001
        return _reject(exc, request_id)
    return _json({"input_tokens": count}, request_id=request_id)


# GET /v1/models
# ------------------------------------------------------------------------------


def _model_dict(route: Any) -> dict[str, Any]:
    return {
        "type": "model",
        "id": route.name,
        "display_name": route.name,
        "created_at": route.created_at.isoformat().replace("+00:00", "Z"),
    }


@csrf_exempt
async def models_view(request: HttpRequest) -> HttpResponse:
    request_id = new_request_id()
    try:
        if request.method != "GET":
            raise MethodNotAllowed(f"{request.method} is not allowed; use GET")
        caller = await _authenticate(request)
        routes = routes_for_caller(caller=caller, routes=await _routes())
    except Exception as exc:  # noqa: BLE001
        return _reject(exc, request_id)
    data = [_model_dict(r) for r in routes]
    return _json(
        {
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        },
        request_id=request_id,
    )


@csrf_exempt
async def model_detail_view(request: HttpRequest, model_id: str) -> HttpResponse:
    request_id = new_request_id()
    try:
        if request.method != "GET":
            raise MethodNotAllowed(f"{request.method} is not allowed; use GET")
        caller = await _authenticate(request)
        routes = routes_for_caller(caller=caller, routes=await _routes())
        route = next((r for r in routes if r.name == model_id), None)
        if route is None:
            raise NotFound(f"model: {model_id}")
    except Exception as exc:  # noqa: BLE001
        return _reject(exc, request_id)
    return _json(_model_dict(route), request_id=request_id)


@csrf_exempt
async def not_found_view(request: HttpRequest, path: str = "") -> HttpResponse:
    """Any other /v1 path: Anthropic's 404 shape, not Django's page."""
    return error_response(NotFound(f"{request.method} /v1/{path} does not exist"), request_id=new_request_id())
