"""OpenAI's error shape for the OpenAI protocols, OpenAI's 404 under its API paths, and the
wire protocol recorded on each captured interaction."""

from __future__ import annotations

import json

import pytest

from apps.proxy.errors import (
    ApiError,
    AuthenticationFailed,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    Overloaded,
    PermissionDenied,
    PromptTooLong,
    RateLimited,
    RequestTooLarge,
)
from apps.proxy.exchange import MethodNotAllowed
from apps.proxy.models import Interaction
from apps.proxy.openai.errors import error_response
from tests.conftest import make_member
from tests.proxy.conftest import assert_error, call, make_route

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "exc, status, error_type, code, param",
    [
        (
            InvalidRequest("messages.0.role: bad", param="messages.0.role"),
            400,
            "invalid_request_error",
            None,
            "messages.0.role",
        ),
        (PromptTooLong(tokens=9000, maximum=8000), 400, "invalid_request_error", "context_length_exceeded", "messages"),
        (AuthenticationFailed("invalid x-api-key"), 401, "invalid_request_error", "invalid_api_key", None),
        (PermissionDenied("no"), 403, "invalid_request_error", "permission_denied", None),
        (ModelNotFound("model: gpt-x", model="gpt-x"), 404, "invalid_request_error", "model_not_found", None),
        (NotFound("nothing here"), 404, "invalid_request_error", None, None),
        (MethodNotAllowed("GET is not allowed"), 405, "invalid_request_error", "method_not_allowed", None),
        (RequestTooLarge("too big"), 413, "invalid_request_error", "request_too_large", None),
        (RateLimited("slow down", headers={"retry-after": "1"}), 429, "requests", "rate_limit_exceeded", None),
        (ApiError("Internal server error"), 500, "server_error", None, None),
        (Overloaded("Overloaded"), 503, "server_error", "overloaded", None),
    ],
)
def test_each_refusal_has_openai_status_type_and_code(exc, status, error_type, code, param):
    response = error_response(exc, request_id="req_1")
    body = json.loads(response.content)
    assert response.status_code == status and response["x-request-id"] == "req_1"
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert (body["error"]["type"], body["error"]["code"], body["error"]["param"]) == (error_type, code, param)
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if status in (429, 503):
        assert response["retry-after"] == "1"


def test_openai_wording_for_a_missing_model_and_a_context_overflow():
    body = json.loads(error_response(ModelNotFound("model: gpt-x", model="gpt-x"), request_id="r").content)
    assert body["error"]["message"] == "The model `gpt-x` does not exist or you do not have access to it."
    body = json.loads(error_response(PromptTooLong(tokens=9000, maximum=8000), request_id="r").content)
    assert "maximum context length is 8000 tokens" in body["error"]["message"]
    assert "resulted in 9000 tokens" in body["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/chat/nothing", "/v1/responses/resp_1/whatever", "/v1/embeddings"])
def test_unknown_paths_of_openai_families_are_openai_404s(path):
    reply = call(path, body={"model": "x"})
    assert reply.status == 404, reply.body
    body = reply.json()
    assert set(body) == {"error"} and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"] == f"Invalid URL (POST {path})"
    assert reply.headers["Content-Type"] == "application/json"


def test_other_unknown_paths_stay_anthropic_404s():
    assert_error(call("/v1/nothing", body={}), 404, "not_found_error")
    assert_error(call("/v1/chatter", body={}), 404, "not_found_error")


def test_a_messages_call_is_recorded_as_protocol_messages(qwen3_tokenizer):
    alice = make_member("team", "alice")
    make_route()
    body = {"model": "qwen3-test", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    reply = call("/v1/messages", secret=alice.secret, body=body)
    assert reply.status == 200, reply.body
    interaction = Interaction.objects.get(request_id=reply.headers["request-id"])
    assert interaction.protocol == "messages" and interaction.payload["protocol"] == "messages"
