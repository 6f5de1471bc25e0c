"""OpenAI Responses on the shared model call (apps.proxy.exchange): POST /v1/responses.

Codex CLI speaks only this protocol. The call is the one every protocol shares (render with
the family adapter, fit, sample, parse, stage the capture before the answer completes, settle
it once delivered); this module supplies the ends: responses.py turns the request into the
internal one, responses_output.py and responses_stream.py turn the parsed completion into
output items, the response object and the event stream. Refusals before the stream are
OpenAI's error bodies (errors.py); a failure after the 200 is response.failed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.http import HttpResponse

from apps.proxy import calls
from apps.proxy.errors import ProxyError
from apps.proxy.openai import errors
from apps.proxy.openai import responses_output as output
from apps.proxy.openai.responses import ResponsesRequest, responses_request_parse
from apps.proxy.openai.responses_stream import ResponseEvents
from apps.proxy.protocol import Protocol, StreamWriter

# The key of the internal request that carries what the answer needs (neither rendered nor
# captured as the request).
OPTIONS = "responses"


def _key() -> bytes:
    """Seals reasoning handed to the client as encrypted_content (and checks it back)."""
    return str(settings.SECRET_KEY).encode()


def _options(prepared: calls.Prepared) -> ResponsesRequest:
    options = prepared.request[OPTIONS]
    assert isinstance(options, ResponsesRequest)
    return options


def response_body(
    *, response_id: str, created_at: int, prepared: calls.Prepared, completion: calls.Completion | None
) -> dict[str, Any]:
    """The completed (or incomplete) response object of a sampled completion."""
    options = _options(prepared)
    blocks = completion.blocks if completion is not None else []
    incomplete = completion is None or completion.stop_reason == "max_tokens"
    items = output.output_items(
        blocks=blocks, request=options, response_id=response_id, incomplete=incomplete, key=_key()
    )
    delivered = completion.delivered_ids if completion is not None else 0
    # Re-encoding the reasoning text is a few microseconds per hundred tokens.
    reasoning = output.reasoning_tokens(blocks=blocks, encode=prepared.adapter.encode)
    usage = output.usage(
        input_tokens=len(prepared.fitted.rendered.token_ids),
        output_tokens=delivered,
        reasoning=min(reasoning, delivered),
    )
    return _response(
        response_id=response_id,
        created_at=created_at,
        prepared=prepared,
        status="incomplete" if incomplete else "completed",
        items=items,
        usage=usage,
    )


def _response(
    *,
    response_id: str,
    created_at: int,
    prepared: calls.Prepared,
    status: str,
    items: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return output.response_object(
        response_id=response_id,
        created_at=created_at,
        model=prepared.ctx.model_requested,
        request=_options(prepared),
        max_output_tokens=prepared.max_tokens,
        status=status,
        output=items,
        usage=usage,
        error=error,
    )


class _ResponsesStream(StreamWriter):
    def __init__(self, *, response_id: str, prepared: calls.Prepared) -> None:
        self.response_id = response_id
        self.prepared = prepared
        self.created_at = int(time.time())
        self.events = ResponseEvents()
        self.waiting = _response(
            response_id=response_id,
            created_at=self.created_at,
            prepared=prepared,
            status="in_progress",
            items=[],
            usage=None,
        )

    def start(self) -> Iterator[bytes]:
        yield self.events.lifecycle("response.created", self.waiting)
        yield self.events.lifecycle("response.in_progress", self.waiting)

    def keepalive(self) -> bytes:
        # Codex resets its idle timeout on any event; the SDK takes this as the same response.
        return self.events.lifecycle("response.in_progress", self.waiting)

    def completion(self, completion: calls.Completion | None) -> Iterator[bytes]:
        answer = response_body(
            response_id=self.response_id, created_at=self.created_at, prepared=self.prepared, completion=completion
        )
        for index, item in enumerate(answer["output"]):
            yield from self.events.item(index=index, item=item)
        final = "response.incomplete" if answer["status"] == "incomplete" else "response.completed"
        yield self.events.lifecycle(final, answer)

    def empty(self) -> Iterator[bytes]:
        yield from self.completion(None)

    def error(self, exc: ProxyError) -> Iterator[bytes]:
        error = errors.error_object(exc)
        failed = {
            **self.waiting,
            "status": "failed",
            "error": {"code": error["code"] or "server_error", "message": error["message"]},
        }
        yield self.events.lifecycle("response.failed", failed)


class ResponsesProtocol(Protocol):
    """OpenAI Responses: POST /v1/responses, what Codex CLI speaks."""

    name = "responses"
    response_prefix = "resp"
    request_id_headers = ("x-request-id",)

    def parse(self, body: Any) -> dict[str, Any]:
        parsed = responses_request_parse(body, key=_key())
        internal = dict(parsed.internal)
        internal[OPTIONS] = dataclasses.replace(parsed, internal={})  # no cycle through the request
        return internal

    def session_key(self, request: dict[str, Any]) -> str:
        # Codex sends its thread id here (and as the session-id header).
        return str(request[OPTIONS].prompt_cache_key)

    def body(
        self, *, response_id: str, prepared: calls.Prepared, completion: calls.Completion | None
    ) -> dict[str, Any]:
        return response_body(
            response_id=response_id, created_at=int(time.time()), prepared=prepared, completion=completion
        )

    def stream(self, *, response_id: str, prepared: calls.Prepared) -> StreamWriter:
        return _ResponsesStream(response_id=response_id, prepared=prepared)

    def error_response(self, exc: ProxyError, *, request_id: str) -> HttpResponse:
        return errors.error_response(exc, request_id=request_id)


RESPONSES = ResponsesProtocol()
