"""What a wire protocol supplies to the shared model call (apps.proxy.exchange).

The call itself is protocol-neutral: authenticate, read and decode the body, resolve the
route, admit, prepare (render, tokenize, fit), sample, and record what became of the answer
(delivery.py). A protocol is only the translation at both ends:

* `parse`: its request body -> the internal request, which is Anthropic Messages shaped and
  normalized as schema.messages_request_parse leaves it (system, messages, tools,
  tool_choice, thinking, max_tokens, stop_sequences, stream, temperature, top_p, top_k,
  metadata); a protocol may add keys of its own for its writers (they are neither rendered
  nor captured as the request);
* `body`: a Completion (or None: max_tokens 0, nothing sampled) -> its JSON answer;
* `stream`: a `StreamWriter` for one streamed answer: the opening events, the keepalive
  bytes sent while sampling, the completion's events through the end, the end of an empty
  answer, and an error after the 200;
* `error_response`: a refusal in its error shape.

`name` is recorded on the captured interaction (Interaction.protocol). Anthropic Messages
is `MESSAGES` below; OpenAI's protocols live in apps.proxy.openai.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import Any

from django.http import HttpResponse

from apps.core.ids import new_id
from apps.proxy import calls, schema, streaming
from apps.proxy.errors import ProxyError, error_response


class StreamWriter(ABC):
    """The events of one streamed answer, in order: `start`, then `keepalive` any number of
    times, then exactly one of `completion`, `empty` or `error`. May keep state (sequence
    numbers, indexes) between calls."""

    @abstractmethod
    def start(self) -> Iterable[bytes]:
        """Sent at once, before sampling."""

    @abstractmethod
    def keepalive(self) -> bytes:
        """Sent while the sampler works, so the client's idle timeout does not fire."""

    @abstractmethod
    def completion(self, completion: calls.Completion) -> Iterable[bytes]:
        """The whole answer through its last event (it is staged before the first)."""

    @abstractmethod
    def empty(self) -> Iterable[bytes]:
        """The end of an answer with nothing sampled (max_tokens 0)."""

    @abstractmethod
    def error(self, exc: ProxyError) -> Iterable[bytes]:
        """A failure after the 200: the protocol's in-stream error."""


class Protocol(ABC):
    name: str = ""
    response_prefix: str = ""
    # Headers that carry the request id on an answer, besides `request-id`.
    request_id_headers: tuple[str, ...] = ()

    @abstractmethod
    def parse(self, body: Any) -> dict[str, Any]:
        """A decoded request body -> the validated internal request (InvalidRequest if bad)."""

    def session_key(self, request: dict[str, Any]) -> str:
        """The session the request names in its body ("": the correlation headers decide);
        it keys the prefix cache and the compact staging of prompt ids."""
        return ""

    def response_id(self) -> str:
        return new_id(self.response_prefix)

    @abstractmethod
    def body(
        self, *, response_id: str, prepared: calls.Prepared, completion: calls.Completion | None
    ) -> dict[str, Any]:
        """The non-streamed answer (`completion` None: max_tokens 0, nothing sampled)."""

    @abstractmethod
    def stream(self, *, response_id: str, prepared: calls.Prepared) -> StreamWriter:
        """The writer of one streamed answer."""

    @abstractmethod
    def error_response(self, exc: ProxyError, *, request_id: str) -> HttpResponse:
        """A refusal before any answer, in this protocol's error shape."""


# ANTHROPIC MESSAGES
# ------------------------------------------------------------------------------


class _MessagesStream(StreamWriter):
    def __init__(self, *, response_id: str, prepared: calls.Prepared) -> None:
        self.response_id = response_id
        self.prepared = prepared
        self.input_tokens = len(prepared.fitted.rendered.token_ids)

    def start(self) -> Iterator[bytes]:
        yield streaming.message_start(
            message_id=self.response_id,
            model=self.prepared.ctx.model_requested,
            usage=calls.usage(input_tokens=self.input_tokens, output_tokens=0),
        )

    def keepalive(self) -> bytes:
        return streaming.ping()

    def completion(self, completion: calls.Completion) -> Iterator[bytes]:
        for index, block in enumerate(completion.blocks):
            yield from streaming.block_events(index=index, block=block)
        end_usage = calls.usage(input_tokens=self.input_tokens, output_tokens=completion.delivered_ids)
        yield from streaming.message_end(
            stop_reason=completion.stop_reason, stop_sequence=completion.stop_sequence, usage=end_usage
        )

    def empty(self) -> Iterator[bytes]:
        usage = calls.usage(input_tokens=self.input_tokens, output_tokens=0)
        yield from streaming.message_end(stop_reason="max_tokens", stop_sequence=None, usage=usage)

    def error(self, exc: ProxyError) -> Iterator[bytes]:
        yield streaming.error_event(error_type=exc.error_type, message=exc.message)


class MessagesProtocol(Protocol):
    """Anthropic Messages: POST /v1/messages, what Claude Code speaks."""

    name = "messages"
    response_prefix = "msg"

    def parse(self, body: Any) -> dict[str, Any]:
        return schema.messages_request_parse(body)

    def body(
        self, *, response_id: str, prepared: calls.Prepared, completion: calls.Completion | None
    ) -> dict[str, Any]:
        return calls.message_body(message_id=response_id, prepared=prepared, completion=completion)

    def stream(self, *, response_id: str, prepared: calls.Prepared) -> StreamWriter:
        return _MessagesStream(response_id=response_id, prepared=prepared)

    def error_response(self, exc: ProxyError, *, request_id: str) -> HttpResponse:
        return error_response(exc, request_id=request_id)


MESSAGES = MessagesProtocol()
