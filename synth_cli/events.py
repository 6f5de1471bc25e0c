"""Reading a run's ordered events: pages, or a followed server-sent event stream.

Following survives dropped connections and server-side stream timeouts: every event
carries its sequence number as the SSE id, and a reconnect sends it back as
Last-Event-ID (and `after`), so the server resumes right after it. Events at or below
the cursor are never handed out twice, whatever the server sends. Reconnects after an
error back off exponentially and give up after SYNTH_FOLLOW_RETRIES consecutive failures
(default 8); a clean close by the server (its `timeout`) is not a failure and
reconnects at once. The stream ends with an `end` event carrying the run's final status.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
from httpx_sse import EventSource, SSEError

from synth_cli.config import follow_retries, http_retry_wait
from synth_cli.errors import ApiError, CliError
from synth_cli.http import Api, error_from_response, transport_reason

# Read timeout of the stream: the server sends a keepalive every 10 s, so silence for this
# long means the connection is dead and should be re-opened.
STREAM_TIMEOUT = httpx.Timeout(10.0, read=45.0)


def events_path(run_id: str) -> str:
    return f"/api/runs/{quote(run_id, safe='')}/events"


def events_page_all(api: Api, run_id: str, *, after: int) -> list[dict[str, Any]]:
    """Every event after `after`, now (no waiting)."""
    events: list[dict[str, Any]] = []
    while True:
        page = api.get(events_path(run_id), params={"after": after, "limit": 1000})
        events.extend(page.get("results") or [])
        after = page.get("after", after)
        if not page.get("has_more") or not page.get("results"):
            return events


def _open(api: Api, run_id: str, *, after: int, server_timeout: float | None) -> httpx.Response:
    """One streaming request from cursor `after` (a seam for tests that count reconnects)."""
    params: dict[str, Any] = {"follow": 1}
    if after:
        params["after"] = after
    if server_timeout:
        params["timeout"] = server_timeout
    # application/json as a second choice: the server's content negotiation (DRF) has no
    # text/event-stream renderer and answers 406 to an Accept of the stream type alone.
    headers = {"Accept": "text/event-stream, application/json;q=0.5", "Cache-Control": "no-store"}
    if after:
        headers["Last-Event-ID"] = str(after)
    request = api.http.build_request("GET", events_path(run_id), params=params, headers=headers, timeout=STREAM_TIMEOUT)
    return api.http.send(request, stream=True)


def events_follow(
    api: Api,
    run_id: str,
    *,
    after: int,
    on_event: Callable[[dict[str, Any]], None],
    server_timeout: float | None = None,
    on_reconnect: Callable[[int, str], None] | None = None,
) -> str:
    """Hand every event after `after` to on_event, in order, once; return the final status."""
    # Read before anything is sent, so that a malformed variable is a usage error up front.
    max_failures = follow_retries()
    backoff = http_retry_wait() or 0.05
    last = after
    failures = 0
    retry_ms = 1000  # the server's `retry:` hint, for a stream that closes immediately
    while True:
        opened = time.monotonic()
        received = 0
        try:
            response = _open(api, run_id, after=last, server_timeout=server_timeout)
            try:
                if response.status_code >= 500 or response.status_code == 429:
                    response.read()
                    raise _Retryable(error_from_response(response, method="GET", path=events_path(run_id)))
                if not response.is_success:
                    response.read()
                    raise error_from_response(response, method="GET", path=events_path(run_id))
                failures = 0  # connected: the budget is for consecutive failures
                for sse in EventSource(response).iter_sse():
                    if sse.retry:
                        retry_ms = sse.retry
                    if sse.event == "end":
                        data = json.loads(sse.data or "{}")
                        return str(data.get("status") or "")
                    if not sse.data:
                        continue
                    event = json.loads(sse.data)
                    seq = int(event.get("seq") or sse.id or 0)
                    if seq <= last:
                        continue
                    on_event(event)
                    last = seq
                    received += 1
            finally:
                response.close()
        except SSEError as exc:
            raise CliError(f"the server did not answer with an event stream: {exc}") from None
        except ValueError as exc:
            raise CliError(f"the event stream held malformed data: {exc}") from None
        except (httpx.TransportError, _Retryable) as exc:
            failures += 1
            if failures > max_failures:
                if isinstance(exc, _Retryable):
                    raise exc.error from None
                raise api.unreachable(exc) from None
            if on_reconnect:
                on_reconnect(last, f"{_describe(exc)}; retry {failures}")
            time.sleep(min(backoff * 2 ** (failures - 1), 10.0))
            continue
        # Closed without `end`: the server's stream timeout (or a proxy's). Resume at once,
        # unless it closed straight away with nothing, which would make a busy loop.
        if on_reconnect:
            on_reconnect(last, "stream closed by the server")
        if received == 0 and time.monotonic() - opened < 1.0:
            time.sleep(retry_ms / 1000)


class _Retryable(Exception):
    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _Retryable):
        return exc.error.message
    return f"connection lost ({transport_reason(exc)})"
