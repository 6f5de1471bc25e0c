"""The /v1 endpoints in Anthropic's wire format (async views, served by ASGI/uvicorn).

    POST /v1/messages               (?beta=true accepted) streaming SSE or one JSON message
    POST /v1/messages/count_tokens  {"input_tokens": N}, exact, with the model's tokenizer
    GET  /v1/models[/<id>]          the routes this caller may use, in a shape both the
                                    Anthropic and the OpenAI SDKs parse
    GET  /healthz                   liveness and database reachability (no authentication)

Thin: read HTTP, run the call (exchange.py, shared with the OpenAI protocols of
apps.proxy.openai), write HTTP. Every failure is an Anthropic-shaped error
(apps.proxy.errors) except under the OpenAI paths, which answer in OpenAI's.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from apps.core.db import database_answers
from apps.proxy import calls, pool, schema
from apps.proxy.db import db_phase
from apps.proxy.errors import ModelNotFound, NotFound, error_response, new_request_id
from apps.proxy.exchange import (
    MethodNotAllowed,
    authenticate,
    body_parsed,
    context_build,
    json_answer,
    model_call,
    proxy_error,
    reject,
    routes_current,
)
from apps.proxy.openai import errors as openai_errors
from apps.proxy.openai import views as openai_views
from apps.proxy.protocol import MESSAGES
from apps.proxy.routes import routes_for_caller

_reject = reject  # the name tests and older callers use


# POST /v1/messages
# ------------------------------------------------------------------------------


@csrf_exempt
async def messages_view(request: HttpRequest) -> HttpResponseBase:
    return await model_call(request, protocol=MESSAGES)


# POST /v1/messages/count_tokens
# ------------------------------------------------------------------------------


@csrf_exempt
async def count_tokens_view(request: HttpRequest) -> HttpResponse:
    request_id = new_request_id()
    try:
        if request.method != "POST":
            raise MethodNotAllowed(f"{request.method} is not allowed; use POST")
        caller = await authenticate(request)
        body = await body_parsed(request, schema.count_tokens_request_parse)
        ctx = await context_build(request, caller=caller, model=body["model"], request_id=request_id)
        async with pool.counting.reserve(caller=caller.key):
            count = await calls.tokens_count(ctx=ctx, request=body)
    except Exception as exc:  # noqa: BLE001
        return reject(exc, request_id)
    return json_answer({"input_tokens": count}, request_id=request_id)


# GET /v1/models
# ------------------------------------------------------------------------------


# One shape both SDKs parse: Anthropic's keys (type, display_name, created_at; the list's
# has_more, first_id, last_id) and OpenAI's (object, created in seconds, owned_by; the
# list's object "list").
OWNED_BY = "synth"


def _model_dict(route: Any) -> dict[str, Any]:
    return {
        "type": "model",
        "id": route.name,
        "display_name": route.name,
        "created_at": route.created_at.isoformat().replace("+00:00", "Z"),
        "object": "model",
        "created": int(route.created_at.timestamp()),
        "owned_by": OWNED_BY,
    }


def _models_reject(exc: Exception, request_id: str) -> HttpResponse:
    """Anthropic's error body with OpenAI's `param` and `code` added: either SDK may ask."""
    response = reject(exc, request_id)
    body = json.loads(response.content)
    opened = openai_errors.error_object(proxy_error(exc, request_id))
    body["error"].update(param=opened["param"], code=opened["code"])
    response.content = json.dumps(body).encode()
    return response


@csrf_exempt
async def models_view(request: HttpRequest) -> HttpResponse:
    request_id = new_request_id()
    try:
        if request.method != "GET":
            raise MethodNotAllowed(f"{request.method} is not allowed; use GET")
        caller = await authenticate(request)
        routes = routes_for_caller(caller=caller, routes=await routes_current())
    except Exception as exc:  # noqa: BLE001
        return _models_reject(exc, request_id)
    data = [_model_dict(r) for r in routes]
    return json_answer(
        {
            "object": "list",
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
        caller = await authenticate(request)
        routes = routes_for_caller(caller=caller, routes=await routes_current())
        route = next((r for r in routes if r.name == model_id), None)
        if route is None:
            raise ModelNotFound(f"model: {model_id}", model=model_id)
    except Exception as exc:  # noqa: BLE001
        return _models_reject(exc, request_id)
    return json_answer(_model_dict(route), request_id=request_id)


@csrf_exempt
async def not_found_view(request: HttpRequest, path: str = "") -> HttpResponse:
    """Any other /v1 path: Anthropic's 404 shape (OpenAI's under its API paths), not Django's page."""
    if openai_views.is_api_family(path):
        return openai_views.not_found(request, path)
    return error_response(NotFound(f"{request.method} /v1/{path} does not exist"), request_id=new_request_id())


async def health_view(request: HttpRequest) -> HttpResponse:
    """The gateway's health answer (apps.core.apis.HealthApi), its query run as one of the
    process's database phases: on a database thread's kept connection, not on a thread of
    its own that would keep one more (a failure answers 500, in Anthropic's shape)."""
    await db_phase(database_answers)()
    return JsonResponse({"ok": True})
