"""The one way the CLI talks to the server: httpx, bearer token, retries, one error shape.

Retries (tenacity): connection errors, 429 and 5xx answers are retried with exponential
backoff and jitter. Every write the CLI makes is safe to repeat (runs carry an
Idempotency-Key, profile and dataset publishes are content-addressed, cancel is
idempotent); a request marked `idempotent=False` is only retried when the connection
was never made, since then the server cannot have acted on it.

Server errors come back as {"error": {"type", "message", "field"}} (apps/core/errors.py)
and become an ApiError with that message; anything else (an HTML 404 from a proxy, a
gateway's 502 page) becomes a message naming the method, path and status.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import httpx
import tenacity

from synth_cli import __version__
from synth_cli.config import Settings, http_retries, http_retry_wait
from synth_cli.errors import ApiError, Unreachable

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
# Uploads and downloads move whole archives; give them room to write and read.
TRANSFER_TIMEOUT = httpx.Timeout(300.0, connect=10.0)
MAX_PAGE = 500  # the server's max_page_size (apps/core/pagination.py)


class _RetryableStatus(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def transport_reason(exc: BaseException) -> str:
    """'connection refused', 'timed out', ... from an httpx transport error."""
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    text = str(exc) or type(exc).__name__
    # "[Errno 111] Connection refused" -> "connection refused"
    text = re.sub(r"^\[Errno -?\d+\]\s*", "", text.strip().splitlines()[-1] if text.strip() else text)
    return text[:1].lower() + text[1:] if text else type(exc).__name__


def error_from_response(response: httpx.Response, *, method: str, path: str) -> ApiError:
    """The server's error message (one line), prefixed for the statuses users must act on."""
    status = response.status_code
    error_type = field = None
    message = ""
    try:
        body = response.json()
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and error.get("message"):
            message = str(error["message"])
            error_type = error.get("type")
            field = error.get("field")
    except (ValueError, httpx.ResponseNotRead):
        pass
    if not message:
        message = f"{method} {path} returned HTTP {status} {response.reason_phrase}".rstrip()
    if status == 401:
        message = f"the server rejected the token (401): {message}"
    elif status == 403:
        message = f"permission denied (403): {message}"
    else:
        message = f"{message} ({status})"
    return ApiError(message, status=status, error_type=error_type, field=field)


def response_json(response: httpx.Response) -> Any:
    """The body as JSON; an HTML page from a proxy in front of the API is an error, not a crash."""
    try:
        return response.json()
    except ValueError:
        kind = response.headers.get("content-type", "no content type")
        raise ApiError(
            f"{response.request.method} {response.request.url.path} answered {response.status_code} with {kind}, not JSON",
            status=response.status_code,
        ) from None


# Tests swap this for an httpx.MockTransport to exercise retries without a server.
transport_factory: Any = None


class Api:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.base_url = settings.url
        transport = transport_factory() if transport_factory is not None else None
        self.http = httpx.Client(
            base_url=self.base_url,
            headers={
                "Authorization": f"Bearer {settings.token}",
                "Accept": "application/json",
                "User-Agent": f"synth-cli/{__version__}",
            },
            timeout=DEFAULT_TIMEOUT,
            transport=transport,
            follow_redirects=False,
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ requests

    def unreachable(self, exc: BaseException) -> Unreachable:
        return Unreachable(f"cannot reach {self.base_url}: {transport_reason(exc)}")

    def request(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool = True,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send with retries; a 2xx response comes back, anything else raises a CliError."""
        retry_on: tuple[type[BaseException], ...] = (
            (httpx.TransportError, _RetryableStatus) if idempotent else (httpx.ConnectError,)
        )
        wait = http_retry_wait()
        retrying = tenacity.Retrying(
            # The first attempt and SYNTH_HTTP_RETRIES retries; backoff doubles from the wait.
            stop=tenacity.stop_after_attempt(1 + http_retries()),
            wait=tenacity.wait_exponential_jitter(initial=wait, max=8.0, jitter=wait / 2)
            if wait
            else tenacity.wait_none(),
            retry=tenacity.retry_if_exception_type(retry_on),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    response = self.http.request(method, path, **kwargs)
                    if response.status_code == 429 or response.status_code >= 500:
                        raise _RetryableStatus(response)
        except _RetryableStatus as exc:
            response = exc.response
        except httpx.TransportError as exc:
            raise self.unreachable(exc) from None
        if response.is_success:
            return response
        raise error_from_response(response, method=method, path=path)

    def get(self, path: str, **kwargs: Any) -> Any:
        return response_json(self.request("GET", path, **kwargs))

    def post(self, path: str, **kwargs: Any) -> Any:
        return response_json(self.request("POST", path, **kwargs))

    def collect(self, path: str, *, params: dict[str, Any] | None = None, limit: int | None = None) -> list[Any]:
        """Every item of a paged list (`results` + `next`), up to `limit`.

        `next` is followed by its path and query only, against our own base URL: behind
        a proxy the server may build it with an internal host name.
        """
        params = {k: v for k, v in (params or {}).items() if v is not None}
        params["limit"] = min(limit, MAX_PAGE) if limit else MAX_PAGE
        items: list[Any] = []
        page = self.get(path, params=params)
        while True:
            if isinstance(page, list):  # an unpaged list
                items.extend(page)
                break
            items.extend(page.get("results") or [])
            next_url = page.get("next")
            if not next_url or (limit and len(items) >= limit):
                break
            parts = urlsplit(next_url)
            page = self.get(parts.path + (f"?{parts.query}" if parts.query else ""))
        return items[:limit] if limit else items


def plain_client() -> httpx.Client:
    """A client without our token, for presigned URLs on other hosts (object storage)."""
    transport = transport_factory() if transport_factory is not None else None
    return httpx.Client(
        timeout=TRANSFER_TIMEOUT, transport=transport, headers={"User-Agent": f"synth-cli/{__version__}"}
    )


def same_origin(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme, pa.netloc) == (pb.scheme, pb.netloc)
