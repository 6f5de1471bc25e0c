"""The /v1 endpoints in OpenAI's wire formats (async views on the shared call, exchange.py).

POST /v1/chat/completions   Chat Completions, streamed (SSE chunks, [DONE]) or one JSON
POST /v1/responses          Responses, streamed (the Responses events) or one response object
any other path of OpenAI's API families (chat/, responses, completions, embeddings, ...):
                            OpenAI's 404 JSON, "Invalid URL (METHOD /v1/...)"
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from apps.proxy.errors import new_request_id
from apps.proxy.exchange import model_call
from apps.proxy.openai.chat import CHAT
from apps.proxy.openai.errors import error_response, url_not_found
from apps.proxy.openai.responses_protocol import RESPONSES

# The first segments of OpenAI's API paths: under these, an unknown path answers in
# OpenAI's shape (the client is an OpenAI SDK), everything else in Anthropic's.
API_FAMILIES = (
    "assistants",
    "audio",
    "batches",
    "chat",
    "completions",
    "conversations",
    "embeddings",
    "files",
    "fine_tuning",
    "images",
    "moderations",
    "realtime",
    "responses",
    "threads",
    "uploads",
    "vector_stores",
)
API_FAMILIES_PATTERN = r"^(?P<path>(?:" + "|".join(API_FAMILIES) + r")(?:/.*)?)$"


@csrf_exempt
async def chat_completions_view(request: HttpRequest) -> HttpResponseBase:
    return await model_call(request, protocol=CHAT)


@csrf_exempt
async def not_found_view(request: HttpRequest, path: str = "") -> HttpResponse:
    return error_response(
        url_not_found(method=request.method or "GET", path=f"/v1/{path}"), request_id=new_request_id()
    )


@csrf_exempt
async def responses_view(request: HttpRequest) -> HttpResponseBase:
    """POST /v1/responses: OpenAI Responses (Codex CLI), streamed or one response object."""
    return await model_call(request, protocol=RESPONSES)
