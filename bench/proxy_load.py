"""Model proxy under load: many concurrent streaming Claude Code sessions against an
instant sampler, through a live uvicorn proxy on 127.0.0.1.

    .venv/bin/python bench/proxy_load.py [--sessions 200] [--turns 5] [--size small|claude-code] [--workers 1]

Set-up (idempotent): the bench's own database (--database-url, default synth_bench_proxy;
DATABASE_URL is not read) created if missing and migrated; the Qwen3 tokenizer
provisioned (manage.py provision_tokenizers) if missing; the route "bench-instant" added
(manage.py route_add; backend "instant", returning at once one Qwen3 tool call, so every
turn is a tool cycle); one model
credential per session, as each attempt of a run holds its own. The proxy is this file run
with --serve in a subprocess: uvicorn serving synth_project.proxy_asgi with uvicorn's
defaults but the deployment's keep-alive (75 s) on a free loopback port, its own process as
in production (so a repeated exception is logged a few times a minute, then counted: see
synth_common.logfold). With --workers N it is N such processes (the floor in each too), as a
proxy given N cores is deployed; their CPU and loop lag are summed and pooled.

Load: --sessions asyncio tasks, each with its own client (one connection, as each harness
process holds its own; --client httpx, the SDKs' transport, or aiohttp, which leaves the
machine more of its CPU), started together, each a
conversation of --turns streaming calls (POST /v1/messages?beta=true, Claude Code's
headers and body fields, the answer's tool_use sent back as a tool_result on the next
call). Per call:
* TTFB: from sending the request to the first byte of the response body (the
  message_start event, sent once the prompt is rendered and tokenized);
* first content: to the first content_block_start (after sampling and staging the
  interaction row);
* done: to message_stop (the client then has the whole answer).
calls/s is completed calls over the load's wall time. A call answered 5xx/429 (or lost)
is retried up to --retries times with backoff, as Claude Code does; failures are counted
and the proxy's exception lines summarized, and latencies are of successful calls only.
The proxy's own per-call timings (render, queue, sample, parse, total) are read back from
the interactions it captured, to tell server time from time spent before the view runs.

Event-loop lag of the proxy is measured INSIDE the proxy process: --serve schedules a
probe coroutine on uvicorn's loop that sleeps --probe-ms and records how late it woke;
the samples taken while the load ran are reported. Chosen over timing GET /v1/models from
outside, which would add the client's own loop lag (200 streams in this process), the
authentication query and its thread hop to the figure; and over running uvicorn in a
thread of this process, which would share the GIL with the client. apps/proxy is not
modified: the probe lives in this file's --serve entry point.

The floor: the same uvicorn process also serves a raw ASGI app under /floor/ (no Django, no
parsing) that answers every POST with the SSE bytes of one real proxy answer, recorded in the
warm-up and sent event by event as the proxy sends them. The same sessions run against it
right after the proxy's load, so the proxy's calls/s is compared with what this machine,
this uvicorn and this client can do at best, in the same run (a shared machine's load
moves both), repeated until it has run as long as the proxy's phase. The floor is bound by
the client more than by the server: with httpx it measured 1,040 to 1,150 calls/s, with
aiohttp 2,620 to 2,780 in the same minutes, while the proxy's own calls/s stayed within 305
to 360 with either. A floor ratio is therefore that of one client; "client" in the JSON
says which.

PostgreSQL CPU per call: pg_stat_statements counts neither connection set-up nor the
backends' own work outside statements, so it is read from /proc: the CPU time (utime +
stime) of the backends connected to the bench's database, sampled every second
during the load (the proxy's pooled backends live through it; one that lives shorter than a
sample is missed). Also printed: every PostgreSQL process of the server (the postmaster's
reaped children included, so exited backends count), which counts other users of a shared
server too. The sampler is a thread of the client's process and a scan of /proc costs about
2 ms of its interpreter: every 5 ms (as it was) it took a third of the client's GIL in the
proxy's phase only, halving the calls/s measured and adding seconds to its TTFB p99.

A warm long call: after the load, one Claude Code conversation alone is grown call by call
until its prompt reaches --long-tokens (100K), each call sent to the proxy and then, the same
request body, to the floor. The proxy's added latency is its time to message_stop less the
floor's (both include the upload of the request and the answer's bytes), over the calls
within 10% of the target, each warm (the call before made its prefix-cache entry).

The last line is one JSON object: sessions, calls_per_s, ttfb_p50_ms, ttfb_p99_ms,
floor_calls_per_s, pg_cpu_ms_per_call, loop_lag_p99_ms, warm_long_added_ms (and the
figures' context: floor ratio, the floor's own TTFB p50 and p99, the TTFB p99 of the
sessions' opening calls, all sent at the same instant, and of the later calls (the floor's
too), pg_cpu_source,
load_avg_1m, errors, warm_long_tokens, warm_long_added_p99_ms, warm_long_ttfb_added_ms,
warm_long_staged_kb: what staging wrote per warm call, the payload TOAST-compressed and the
packed prompt ids).

Bounded: only loopback traffic; each session stops at --turns or when --max-seconds have
passed; every request has a timeout; the proxy is stopped at the end. Prints figures;
asserts nothing. Rows (credentials, interactions) are left in the bench database; the
evidence queue the proxy fills on the bench's Redis db (--broker-url, default db 12; the
environment's CELERY_BROKER_URL is not used) is deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")
DATABASE_URL = "postgres://postgres@127.0.0.1:5432/synth_bench_proxy"
BROKER_URL = "redis://127.0.0.1:6379/12"

ROUTE = "bench-instant"
MESSAGES_PATH = "/v1/messages?beta=true"
FLOOR_PREFIX = "/floor/"
FAMILY = "qwen3"
TOOL_CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def p99_ms(values: list[float]) -> float | None:
    """The p99 in ms for the JSON line (None, not NaN, when there is nothing to rank)."""
    return round(pct(values, 0.99) * 1000, 1) if values else None


def ms(values: list[float]) -> str:
    return f"p50 {pct(values, 0.5) * 1000:.1f} ms, p99 {pct(values, 0.99) * 1000:.1f} ms"


# THE PROXY (subprocess)
# ------------------------------------------------------------------------------


def serve(port: int, lag_file: str, probe_ms: float, workers: int = 1) -> None:
    """uvicorn with the ASGI application and a loop-lag probe on its event loop, in
    ``workers`` processes (this one and workers - 1 forked children), each listening on its
    own SO_REUSEPORT socket of the port, so the kernel spreads the sessions' connections
    over them (one shared socket lets whichever process wakes first accept a burst)."""
    import signal
    import socket

    children: list[int] = []
    index = 0
    for number in range(1, workers):  # forked before the application is imported
        pid = os.fork()
        if pid == 0:
            children, index = [], number
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: ends with the parent, however it ends
            break
        children.append(pid)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(2048)

    import uvicorn

    from synth_project.proxy_asgi import application

    interval = probe_ms / 1000
    floor_events: list[bytes] = []
    floor_file = Path(f"{lag_file}.floor")  # the recorded answer, for every process
    if index:
        lag_file = f"{lag_file}.w{index}"

    async def floor(scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The floor: the recorded SSE bytes, event by event, for any POST; PUT records them."""
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] == "PUT":
            floor_file.with_suffix(".tmp").write_bytes(bytes(body))
            floor_file.with_suffix(".tmp").replace(floor_file)  # whole, for the other processes
            floor_events.clear()
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        if not floor_events:
            floor_events[:] = [event + b"\n\n" for event in floor_file.read_bytes().split(b"\n\n") if event]
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for event in floor_events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(FLOOR_PREFIX):
            await floor(scope, receive, send)
        else:
            await application(scope, receive, send)

    async def probe() -> None:
        # Written as it goes (flushed every ~0.2 s): uvicorn re-raises SIGTERM once it has
        # shut down, so nothing may be left to write at exit.
        loop = asyncio.get_running_loop()
        with open(lag_file, "a", encoding="utf-8") as out:
            last_flush = loop.time()
            while True:
                t0 = loop.time()
                await asyncio.sleep(interval)
                now = loop.time()
                out.write(f"{time.time():.6f} {now - t0 - interval:.6f}\n")
                if now - last_flush > 0.2:
                    out.flush()
                    last_flush = now

    # Keep-alive as deployed (deploy/k8s/proxy.yaml): with uvicorn's 5 s default, every
    # connection idle between the phases is closed and the next phase opens 200 at once.
    # Lifespan on, as uvicorn runs it deployed: the proxy's startup loads its routes'
    # tokenizers and imports before the process accepts a connection (apps.proxy.warmup).
    config = uvicorn.Config(app, lifespan="on", log_level="warning", timeout_keep_alive=75)

    async def main() -> None:
        server = uvicorn.Server(config)
        task = asyncio.create_task(probe())
        try:
            await server.serve(sockets=[listener])  # returns on SIGTERM / SIGINT (graceful shutdown)
        finally:
            task.cancel()

    # The event loop uvicorn's command line runs, as deployed (--loop auto: uvloop, installed
    # from requirements.txt); a bare asyncio.run would measure the standard library's loop.
    asyncio.run(main(), loop_factory=config.get_loop_factory())
    for pid in children:
        os.kill(pid, signal.SIGTERM)
    for pid in children:
        os.waitpid(pid, 0)
    if index:
        os._exit(0)  # a forked child: not back into the parent's caller


# SET-UP (this process)
# ------------------------------------------------------------------------------


def ensure_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(sessions: int) -> tuple[str, list[str]]:
    """Database, tokenizer, route, credentials. Returns (run id, one secret per session)."""
    import io
    from datetime import timedelta

    import django

    ensure_database(os.environ["DATABASE_URL"])
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from apps.proxy.tokenizers import provisioned_status, tokenizer_load

    if provisioned_status(FAMILY) is not None:
        call_command("provision_tokenizers", "--family", FAMILY, stdout=io.StringIO())
    ids = tokenizer_load(FAMILY).encode(TOOL_CALL, add_special_tokens=False).ids
    call_command(
        "route_add",
        ROUTE,
        "--family",
        FAMILY,
        "--context-window",
        "131072",  # the long conversation's 100K-token prompts fit (Qwen3 with YaRN: 128K)
        "--max-output",
        "4096",
        "--backend",
        "instant",
        "--config",
        json.dumps({"token_ids": ids}),
        stdout=io.StringIO(),
    )
    from apps.accounts.services import model_credential_issue, org_get_or_create

    org = org_get_or_create(slug="bench-proxy")
    run_id = f"run_bench_{int(time.time())}"
    secrets = [
        model_credential_issue(
            org=org, run_id=run_id, trial_id=f"trl_bench_{i}", route=ROUTE, snapshot="", ttl=timedelta(hours=1)
        )[1]
        for i in range(sessions)
    ]
    return run_id, secrets


def recorded(run_id: str, since: float) -> None:
    """What the proxy itself recorded for the calls of the load (the captured interactions)."""
    from datetime import UTC, datetime

    from apps.proxy.models import Interaction

    rows = list(
        Interaction.objects.filter(run_id=run_id, created_at__gte=datetime.fromtimestamp(since, tz=UTC)).values_list(
            "timings", "delivery"
        )
    )
    if not rows:
        return
    parts = []
    for name in ("render_ms", "queue_ms", "sample_ms", "parse_ms", "total_ms"):
        values = [t[name] / 1000 for t, _ in rows if name in t]
        if values:
            parts.append(f"{name[:-3]} {pct(values, 0.5) * 1000:.1f}/{pct(values, 0.99) * 1000:.1f}")
    deliveries = dict(Counter(d for _, d in rows))
    print(
        f"proxy-recorded timings of {len(rows)} captured calls, ms p50/p99 (total = request start to staging): "
        f"{', '.join(parts)}; delivery {deliveries}"
    )


def evidence_queue_delete() -> int:
    """Remove what the proxy enqueued for the (absent) evidence worker on this bench's Redis db."""
    try:
        import redis

        client = redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])
        keys = list(client.scan_iter(match="evidence*"))
        length = sum(client.llen(k) for k in keys if client.type(k) == b"list")
        if keys:
            client.delete(*keys)
        return length
    except Exception as exc:  # noqa: BLE001 - cleanup is best effort
        print(f"(could not clean the evidence queue: {exc})")
        return 0


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def cpu_seconds(pid: int) -> float:
    """CPU seconds of the process and of its children (the proxy's other workers)."""
    total = 0.0
    children = Path(f"/proc/{pid}/task/{pid}/children")
    for each in [pid] + [int(c) for c in (children.read_text().split() if children.exists() else [])]:
        fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


# THE LOAD (this process)
# ------------------------------------------------------------------------------


@dataclass
class Stats:
    ttfb: list[float] = field(default_factory=list)
    # The same TTFBs split: each session's opening call (the sessions send theirs at the same
    # instant, a burst of new conversations) and the calls after it.
    ttfb_opening: list[float] = field(default_factory=list)
    ttfb_later: list[float] = field(default_factory=list)
    content: list[float] = field(default_factory=list)
    done: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    client_lag: list[float] = field(default_factory=list)
    retried: int = 0


def sse_events(buffer: bytearray) -> list[tuple[str, dict[str, Any]]]:
    """Complete events at the front of `buffer` (consumed from it)."""
    out = []
    while True:
        end = buffer.find(b"\n\n")
        if end < 0:
            return out
        chunk = bytes(buffer[:end]).decode()
        del buffer[: end + 2]
        fields = dict(line.split(": ", 1) for line in chunk.splitlines() if ": " in line)
        if "event" in fields:
            out.append((fields["event"], json.loads(fields.get("data") or "{}")))


# The load's HTTP client (--client). httpx is the transport of the anthropic and openai Python
# SDKs; aiohttp spends about half its interpreter time per call (0.7-0.8 ms against 1.3-1.5),
# so less of a 2-core machine goes to the client, whose own loop lag is part of
# every latency measured, and the floor is less bound by the client.
CLIENTS = ("httpx", "aiohttp")


async def clients_open(stack: contextlib.AsyncExitStack, *, kind: str, base: str, n: int, timeout: float) -> list[Any]:
    """``n`` clients of ``kind``, each holding one keep-alive connection, closed with ``stack``."""
    if kind == "aiohttp":
        import aiohttp

        def make() -> Any:
            return aiohttp.ClientSession(
                base_url=base,
                timeout=aiohttp.ClientTimeout(total=timeout),
                connector=aiohttp.TCPConnector(limit=1),
            )
    else:
        import httpx

        def make() -> Any:
            return httpx.AsyncClient(base_url=base, timeout=timeout)

    return [await stack.enter_async_context(make()) for _ in range(n)]


def transport_errors() -> tuple[type[BaseException], ...]:
    import aiohttp
    import httpx

    return (httpx.HTTPError, aiohttp.ClientError, asyncio.TimeoutError)


@contextlib.asynccontextmanager
async def posted(
    client: Any, path: str, *, body: dict[str, Any], headers: dict[str, str], timeout: float
) -> AsyncIterator[tuple[int, AsyncIterator[bytes]]]:
    """POST ``body`` as JSON with either client: (status, the response body's chunks as they come)."""
    import httpx

    if isinstance(client, httpx.AsyncClient):
        async with client.stream("POST", path, json=body, headers=headers, timeout=timeout) as resp:
            yield resp.status_code, resp.aiter_raw()
        return
    # The bytes httpx sends for json= (compact, UTF-8 as is).
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    async with client.post(path, data=data, headers={**headers, "content-type": "application/json"}) as resp:
        yield resp.status, resp.content.iter_any()


async def put_bytes(client: Any, path: str, data: bytes) -> None:
    import httpx

    if isinstance(client, httpx.AsyncClient):
        (await client.put(path, content=data)).raise_for_status()
        return
    async with client.put(path, data=data) as resp:
        resp.raise_for_status()


class Failed(Exception):
    def __init__(self, retryable: bool) -> None:
        self.retryable = retryable


async def one_call(
    client: Any,
    conv: Any,
    secret: str,
    stats: Stats,
    timeout: float,
    *,
    path: str = MESSAGES_PATH,
    record: bytearray | None = None,
    opening: bool = False,
) -> list[dict[str, Any]]:
    """One streaming call; the assistant's blocks (the raw SSE bytes into `record`). Raises
    Failed (counted in stats). ``opening``: the session's first call."""
    body = conv.request(max_tokens=4096)
    headers = {**conv.headers(), "x-api-key": secret}
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    first = content = done = None
    t0 = time.perf_counter()
    try:
        async with posted(client, path, body=body, headers=headers, timeout=timeout) as (status, chunks):
            if status != 200:
                async for _ in chunks:
                    pass
                stats.errors[f"HTTP {status}"] += 1
                raise Failed(status >= 500 or status == 429)
            buffer = bytearray()
            async for chunk in chunks:
                now = time.perf_counter()
                if first is None:
                    first = now
                if record is not None:
                    record += chunk
                buffer += chunk
                for event, data in sse_events(buffer):
                    if event == "message_start":
                        stats.prompt_tokens.append(data["message"]["usage"]["input_tokens"])
                    elif event == "content_block_start":
                        content = content or now
                        blocks.append(dict(data["content_block"]))
                        partial[data["index"]] = ""
                    elif event == "content_block_delta":
                        delta = data["delta"]
                        if delta["type"] == "input_json_delta":
                            partial[data["index"]] += delta["partial_json"]
                        elif delta["type"] == "text_delta":
                            blocks[data["index"]]["text"] = blocks[data["index"]].get("text", "") + delta["text"]
                        elif delta["type"] == "thinking_delta":
                            blocks[data["index"]]["thinking"] = (
                                blocks[data["index"]].get("thinking", "") + delta["thinking"]
                            )
                    elif event == "message_stop":
                        done = now
                    elif event == "error":
                        stats.errors[f"error event: {data['error']['type']}"] += 1
                        raise Failed(data["error"]["type"] in ("overloaded_error", "api_error"))
    except transport_errors() as exc:
        stats.errors[type(exc).__name__] += 1
        raise Failed(True) from exc
    if done is None or first is None:
        stats.errors["stream ended without message_stop"] += 1
        raise Failed(True)
    for index, text in partial.items():
        if blocks[index].get("type") == "tool_use" and text:
            blocks[index]["input"] = json.loads(text)
    stats.ttfb.append(first - t0)
    (stats.ttfb_opening if opening else stats.ttfb_later).append(first - t0)
    stats.content.append((content or done) - t0)
    stats.done.append(done - t0)
    return blocks


async def session(
    index: int,
    client: Any,
    secret: str,
    args: argparse.Namespace,
    stats: Stats,
    deadline: float,
    *,
    path: str = MESSAGES_PATH,
    record: bytearray | None = None,
) -> int:
    from bench.claude_code_request import Conversation

    conv = Conversation(seed=index, size=args.size)
    calls = 0
    for _ in range(args.turns):
        blocks = None
        for attempt in range(args.retries + 1):
            if time.monotonic() > deadline:
                stats.errors["not started: --max-seconds reached"] += 1
                return calls
            if attempt:  # a client retries 5xx/429 with backoff, as Claude Code does
                stats.retried += 1
                await asyncio.sleep(0.5 * 2 ** (attempt - 1) * (1 + random.random()))
            if record is not None:
                record.clear()  # the last answer is what is kept
            try:
                blocks = await one_call(
                    client, conv, secret, stats, args.timeout, path=path, record=record, opening=calls == 0
                )
                break
            except Failed as exc:
                if not exc.retryable:
                    return calls
        if blocks is None:
            return calls
        calls += 1
        conv.advance(blocks)
    return calls


async def long_session(client: Any, secret: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """One Claude Code conversation grown call by call until its prompt reaches
    --long-tokens, alone on the proxy: each call, then the same request to the floor. The
    proxy's added latency of a warm call (its prefix-cache entry made by the call before) is
    its time to message_stop less the floor's for the same request body (the upload and the
    answer's bytes are in both), over the calls whose prompt is within 10% of the target."""
    from bench.claude_code_request import Conversation

    conv = Conversation(seed=100_000, size="claude-code")
    proxy, floor = Stats(), Stats()
    rows: list[tuple[int, float, float, float, float]] = []  # tokens, done and TTFB of both
    while len(rows) < 400:
        try:
            blocks = await one_call(client, conv, secret, proxy, args.timeout)
            await one_call(client, conv, secret, floor, args.timeout, path=f"{FLOOR_PREFIX}v1/messages")
        except Failed:
            print(f"long conversation: a call failed at {len(rows)} calls: {dict(proxy.errors) or dict(floor.errors)}")
            return None
        rows.append((proxy.prompt_tokens[-1], proxy.done[-1], floor.done[-1], proxy.ttfb[-1], floor.ttfb[-1]))
        if proxy.prompt_tokens[-1] >= args.long_tokens:
            break
        conv.advance(blocks)
    near = [r for r in rows[1:] if r[0] >= 0.9 * args.long_tokens]
    if not near:
        print(f"long conversation: {len(rows)} calls reached {rows[-1][0]:,} tokens, not {args.long_tokens:,}")
        return None
    added = [r[1] - r[2] for r in near]
    added_ttfb = [r[3] - r[4] for r in near]
    # The first session's credential: its run's trial trl_bench_0.
    staged = await asyncio.to_thread(
        staged_size, run_id=args.run_id, trial_id="trl_bench_0", min_tokens=min(r[0] for r in near)
    )
    print(
        f"long conversation: {len(rows)} calls, prompt {rows[0][0]:,} -> {rows[-1][0]:,} tokens; "
        f"the {len(near)} warm calls of {min(r[0] for r in near):,}+ tokens: proxy done {ms([r[1] for r in near])}, "
        f"floor done {ms([r[2] for r in near])}; added {ms(added)}; added to TTFB {ms(added_ttfb)}; "
        f"staged per call {staged['stored_kb']:.1f} KB stored ({staged['text_kb']:.1f} KB of payload as JSON text, "
        f"{staged['prompt_kb']:.1f} KB of packed prompt ids)"
    )
    return {
        "warm_long_tokens": rows[-1][0],
        "warm_long_added_ms": round(pct(added, 0.5) * 1000, 1),
        "warm_long_added_p99_ms": round(pct(added, 0.99) * 1000, 1),
        "warm_long_ttfb_added_ms": round(pct(added_ttfb, 0.5) * 1000, 1),
        "warm_long_staged_kb": round(staged["stored_kb"], 1),
    }


def staged_size(*, run_id: str, trial_id: str, min_tokens: int) -> dict[str, float]:
    """What staging wrote per call (no evidence worker runs: the rows stay staged): the
    payload as stored (TOAST-compressed) and as JSON text, and the packed prompt ids."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT avg(pg_column_size(payload) + coalesce(octet_length(prompt_ids_packed), 0)), "
            "avg(octet_length(payload::text)), avg(coalesce(octet_length(prompt_ids_packed), 0)) "
            "FROM proxy_interaction WHERE run_id = %s AND trial_id = %s AND prompt_tokens >= %s "
            "AND payload IS NOT NULL",
            [run_id, trial_id, min_tokens],
        )
        stored, text, prompt = (float(v or 0) / 1024 for v in cursor.fetchone())
    connection.close()  # a thread of its own
    return {"stored_kb": stored, "text_kb": text, "prompt_kb": prompt}


async def client_lag_probe(stats: Stats, interval: float) -> None:
    loop = asyncio.get_running_loop()
    while True:
        t0 = loop.time()
        await asyncio.sleep(interval)
        stats.client_lag.append(loop.time() - t0 - interval)


# POSTGRESQL CPU (from /proc)
# ------------------------------------------------------------------------------


def _proc_cpu(stat: str) -> tuple[float, float]:
    """(own utime + stime, reaped children's cutime + cstime) in seconds, from /proc/PID/stat."""
    fields = stat.rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def postgres_processes() -> dict[int, tuple[str, str]]:
    """pid -> (process title, /proc/PID/stat) of every PostgreSQL process visible here."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            if not (title.startswith("postgres") or "/bin/postgres" in title):
                continue
            out[int(entry.name)] = (title, (entry / "stat").read_text())
        except OSError:
            continue  # exited meanwhile
    return out


class PostgresCpu:
    """CPU seconds of PostgreSQL during a window, sampled from /proc in a thread.

    `database`: the backends whose title names the bench's database (each pid's growth from
    its first to its last sample; a backend born after the first sample counts from zero).
    `server`: every PostgreSQL process plus what the postmaster reaped (exited backends),
    which includes other users of a shared server."""

    def __init__(self, *, database: str, interval: float = 1.0) -> None:
        import threading

        self.database = database
        self.interval = interval
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server0 = self._server_total()

    def _server_total(self) -> float:
        total = 0.0
        for title, stat in postgres_processes().values():
            own, reaped = _proc_cpu(stat)
            total += own + (reaped if "/bin/postgres" in title else 0.0)
        return total

    def _sample(self, *, initial: bool = False) -> None:
        for pid, (title, stat) in postgres_processes().items():
            if self.database not in title.split():
                continue
            own = _proc_cpu(stat)[0]
            self._first.setdefault(pid, own if initial else 0.0)
            self._last[pid] = own

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> None:
        self._sample(initial=True)
        self._server0 = self._server_total()
        self._thread.start()

    def stop(self) -> tuple[float, float]:
        """(the bench database's backends, the whole server) CPU seconds since start()."""
        self._stop.set()
        self._thread.join()
        self._sample()
        database = sum(self._last[pid] - self._first[pid] for pid in self._last)
        return database, self._server_total() - self._server0


# THE LOAD (this process)
# ------------------------------------------------------------------------------


async def run_phase(
    clients: list[Any], secrets: list[str], args: argparse.Namespace, *, path: str
) -> tuple[Stats, list[int], float]:
    """All sessions at once against `path`, each on its own client: (stats, calls per
    session, elapsed seconds)."""
    stats = Stats()
    probe = asyncio.create_task(client_lag_probe(stats, args.probe_ms / 1000))
    deadline = time.monotonic() + args.max_seconds
    t0 = time.perf_counter()
    calls = await asyncio.gather(
        *(session(i, clients[i], s, args, stats, deadline, path=path) for i, s in enumerate(secrets))
    )
    elapsed = time.perf_counter() - t0
    probe.cancel()
    return stats, list(calls), elapsed


async def load(base: str, secrets: list[str], args: argparse.Namespace, proxy_pid: int) -> dict[str, Any] | None:
    # One client (one keep-alive connection) per session, as each harness process holds its
    # own: a shared pool of 200 connections makes httpcore scan every connection at every
    # request and every close, which took half of this process' time and throttled the
    # sessions in whichever phase kept more connections idle.
    async with contextlib.AsyncExitStack() as stack:
        clients = await clients_open(stack, kind=args.client, base=base, n=len(secrets), timeout=args.timeout)
        client = clients[0]
        # Warm-up: adapter, tokenizer and sampler load on the first call; not measured. Its
        # last answer's bytes are what the floor serves.
        warm = Stats()
        answer = bytearray()
        await session(
            0,
            client,
            secrets[0],
            argparse.Namespace(**{**vars(args), "turns": 2}),
            warm,
            time.monotonic() + 60,
            record=answer,
        )
        if warm.errors:
            print(f"warm-up failed: {dict(warm.errors)}")
            return None
        await put_bytes(client, f"{FLOOR_PREFIX}sse", bytes(answer))

        # Not measured: one call per session to the floor opens the client's connections, so
        # both measured phases start on open connections, as a fleet's harnesses hold theirs
        # (measured: a phase that opens its 200 connections at once loses seconds to it).
        await run_phase(
            clients, secrets, argparse.Namespace(**{**vars(args), "turns": 1}), path=f"{FLOOR_PREFIX}v1/messages"
        )
        pg = PostgresCpu(database=args.database_url.rsplit("/", 1)[1])
        cpu0, client_cpu0, machine0 = cpu_seconds(proxy_pid), time.process_time(), machine_busy()
        pg.start()
        wall0 = time.time()
        stats, calls, elapsed = await run_phase(clients, secrets, args, path=MESSAGES_PATH)
        wall1 = time.time()
        pg_database, pg_server = pg.stop()
        proxy_cpu, client_cpu = cpu_seconds(proxy_pid) - cpu0, time.process_time() - client_cpu0
        machine1 = machine_busy()
        machine = (machine1[0] - machine0[0]) / max(1, machine1[1] - machine0[1])

        # The floor's phase is repeated until it has run as long as the proxy's (one round is
        # a fifth of it): a short sample moved the ratio of one run by +-0.05 with whatever
        # else this machine did in that second.
        floor, floor_elapsed = Stats(), 0.0
        floor_calls: list[int] = []
        while floor_elapsed < elapsed or not floor_calls:
            more, more_calls, more_elapsed = await run_phase(clients, secrets, args, path=f"{FLOOR_PREFIX}v1/messages")
            floor.ttfb += more.ttfb
            floor.ttfb_later += more.ttfb_later
            floor.errors += more.errors
            floor_calls += more_calls
            floor_elapsed += more_elapsed
        long = await long_session(client, secrets[0], args) if args.long_tokens else None

    args.window = (wall0, wall1)
    total = sum(calls)
    floor_total = sum(floor_calls)
    print(
        f"load: {len(secrets)} concurrent streaming sessions x up to {args.turns} calls ({args.size} conversations, "
        f"prompt {min(stats.prompt_tokens, default=0):,}-{max(stats.prompt_tokens, default=0):,} tokens), "
        f"instant sampler, {args.workers} uvicorn process{'es' if args.workers > 1 else ''}"
    )
    print(
        f"completed calls: {total} in {elapsed:.1f} s = {total / elapsed:,.1f} calls/s; "
        f"sessions finished all turns: {sum(1 for c in calls if c == args.turns)}/{len(secrets)}"
    )
    print(f"errors: {dict(stats.errors) if stats.errors else 'none'}; retried calls: {stats.retried}")
    print(f"TTFB (first SSE byte, message_start): {ms(stats.ttfb)}")
    print(
        f"  of the sessions' opening calls (sent at the same instant): {ms(stats.ttfb_opening)}; "
        f"of the later calls: {ms(stats.ttfb_later)} (the floor's later calls: {ms(floor.ttfb_later)})"
    )
    print(f"first content event (after sampling + staging): {ms(stats.content)}")
    print(f"done (message_stop): {ms(stats.done)}")
    print(
        f"CPU during the load: proxy {proxy_cpu / elapsed:.2f} cores, bench client {client_cpu / elapsed:.2f} cores "
        f"(of {os.cpu_count()}); whole machine {machine:.0%} busy (PostgreSQL's backends included); "
        f"the proxy's CPU per call {proxy_cpu * 1000 / max(1, total):.2f} ms"
    )
    print(
        f"PostgreSQL CPU (/proc): the bench database's backends {pg_database * 1000 / max(1, total):.2f} ms per call; "
        f"every PostgreSQL process of the server (other users and exited backends included) "
        f"{pg_server * 1000 / max(1, total):.2f} ms per call"
    )
    print(
        f"bench client's own loop lag (probe {args.probe_ms:g} ms): {ms(stats.client_lag)}, "
        f"max {max(stats.client_lag, default=0) * 1000:.1f} ms"
    )
    floor_rate = floor_total / floor_elapsed
    print(
        f"floor (raw ASGI app, the same SSE bytes, same uvicorn and client): {floor_total} calls in "
        f"{floor_elapsed:.1f} s = {floor_rate:,.1f} calls/s, TTFB {ms(floor.ttfb)}; "
        f"errors: {dict(floor.errors) if floor.errors else 'none'}; proxy/floor {total / elapsed / floor_rate:.2f}"
    )
    return {
        "sessions": len(secrets),
        "proxy_processes": args.workers,
        "client": args.client,
        "client_cpu_ms_per_call": round(client_cpu * 1000 / max(1, total), 2),
        "calls_per_s": round(total / elapsed, 1),
        "ttfb_p50_ms": round(pct(stats.ttfb, 0.5) * 1000, 1),
        "ttfb_p99_ms": round(pct(stats.ttfb, 0.99) * 1000, 1),
        "floor_calls_per_s": round(floor_rate, 1),
        # The floor's own time to first byte under the same closed-loop load: every session
        # sends its next call at once, so a call waits behind the others (sessions / rate).
        "floor_ttfb_p50_ms": round(pct(floor.ttfb, 0.5) * 1000, 1),
        "floor_ttfb_p99_ms": round(pct(floor.ttfb, 0.99) * 1000, 1),
        "ttfb_opening_p99_ms": p99_ms(stats.ttfb_opening),
        "ttfb_later_p99_ms": p99_ms(stats.ttfb_later),
        "floor_ttfb_later_p99_ms": p99_ms(floor.ttfb_later),
        "pg_cpu_ms_per_call": round(pg_database * 1000 / max(1, total), 2),
        # The steadiest figure to compare two versions of the proxy by: calls/s and the floor
        # move with whatever else the machine does, CPU per call much less.
        "proxy_cpu_ms_per_call": round(proxy_cpu * 1000 / max(1, total), 2),
        "loop_lag_p99_ms": None,  # measured in the proxy process: filled in by main()
        "floor_ratio": round(total / elapsed / floor_rate, 3),
        "pg_cpu_source": "proc",
        "pg_cpu_server_ms_per_call": round(pg_server * 1000 / max(1, total), 2),
        "errors": sum(stats.errors.values()),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        # A warm call of a --long-tokens conversation alone: the proxy's time less the floor's.
        "warm_long_tokens": None,
        "warm_long_added_ms": None,
        "warm_long_added_p99_ms": None,
        "warm_long_ttfb_added_ms": None,
        "warm_long_staged_kb": None,
        **(long or {}),
    }


def summarize_log(path: Path) -> None:
    """The proxy's distinct exception lines (tracebacks' last lines), most frequent first."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.exists() else []
    errors = Counter(
        line.strip()[:160]
        for line in lines
        if line
        and not line.startswith((" ", "Traceback", "During", "The above"))
        and ("Error" in line.split(":", 1)[0] or "Exception" in line.split(":", 1)[0])
    )
    if errors:
        print(f"proxy log {path} ({len(lines)} lines); exceptions:")
        for line, count in errors.most_common(3):
            print(f"  {count} x {line}")
    else:
        path.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=5, help="calls per session")
    parser.add_argument(
        "--size",
        choices=["small", "claude-code"],
        default="small",
        help="conversation shape (claude-code: ~18K-token prompts; CPU-bound, use fewer sessions)",
    )
    parser.add_argument("--max-seconds", type=float, default=90, help="no call starts after this")
    parser.add_argument(
        "--long-tokens",
        type=int,
        default=100_000,
        help="after the load, one conversation grown to this prompt size, call by call against the proxy "
        "and the floor: the added latency of a warm call (0: skip)",
    )
    parser.add_argument(
        "--client",
        choices=CLIENTS,
        default="httpx",
        help="the load's HTTP client, for the proxy and the floor alike (httpx: the SDKs' own)",
    )
    parser.add_argument("--timeout", type=float, default=60, help="per-request timeout, seconds")
    parser.add_argument("--probe-ms", type=float, default=10, help="loop-lag probe interval")
    parser.add_argument("--retries", type=int, default=2, help="retries of a failed call (5xx, 429, transport)")
    parser.add_argument(
        "--proxy-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment of the proxy process, e.g. SYNTH_PROXY_CPU_WORKERS=4 (repeatable)",
    )
    parser.add_argument(
        "--database-url", default=DATABASE_URL, help="the bench's PostgreSQL database (created if missing)"
    )
    parser.add_argument(
        "--broker-url", default=BROKER_URL, help="the bench's Redis broker (its evidence queue is deleted)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="proxy processes (the floor runs in the same ones), each on its own SO_REUSEPORT socket",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--lag-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.port, args.lag_file, args.probe_ms, args.workers)
        return

    import logging

    # The bench's own database and broker, whatever the environment says: the evidence queue
    # is deleted from this broker at the end.
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["CELERY_BROKER_URL"] = args.broker_url
    logging.getLogger("httpx").setLevel(logging.WARNING)
    random.seed(0)
    t_setup = time.perf_counter()
    run_id, secrets = setup(args.sessions)
    port = free_port()
    lag_file = tempfile.NamedTemporaryFile(prefix="proxy-lag-", suffix=".json", delete=False).name
    log_path = Path(lag_file).with_suffix(".log")
    env = dict(os.environ)
    for item in args.proxy_env:
        name, _, value = item.partition("=")
        env[name] = value
    server = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            "--port",
            str(port),
            "--lag-file",
            lag_file,
            "--probe-ms",
            str(args.probe_ms),
            "--workers",
            str(args.workers),
        ],
        cwd=ROOT,
        env=env,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
    )
    import httpx

    base = f"http://127.0.0.1:{port}"
    figures = None
    try:
        for _ in range(300):
            if server.poll() is not None:
                raise SystemExit(f"the proxy exited with {server.returncode}")
            try:
                httpx.get(f"{base}/healthz", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        print(
            f"set-up (database, tokenizer, route, {len(secrets)} credentials, proxy start): "
            f"{time.perf_counter() - t_setup:.1f} s"
        )
        args.run_id = run_id  # the long conversation's staged rows are read back by it
        figures = asyncio.run(load(base, secrets, args, server.pid))
        time.sleep(0.5)  # the probe's last samples of the window reach its file
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    window = getattr(args, "window", None)
    samples = []
    files = [Path(lag_file)] + sorted(Path(lag_file).parent.glob(Path(lag_file).name + ".w*"))
    for path in files:  # every proxy process' probe
        for line in path.read_text(encoding="utf-8").splitlines():
            at, _, lag = line.partition(" ")
            if lag:
                samples.append((float(at), float(lag)))
        path.unlink(missing_ok=True)
    Path(f"{lag_file}.floor").unlink(missing_ok=True)
    lag: list[float] = []
    if window:
        lag = [lag for at, lag in samples if window[0] <= at <= window[1]]
        print(
            f"proxy event-loop lag during the load (in-process probe, {args.probe_ms:g} ms sleeps, {len(lag)} samples): "
            f"{ms(lag)}, max {max(lag, default=float('nan')) * 1000:.1f} ms"
        )
    if window:
        recorded(run_id, window[0])
    summarize_log(log_path)
    dropped = evidence_queue_delete()
    print(f"(deleted {dropped} evidence-queue messages from the bench broker)")
    if figures is None:
        raise SystemExit("the load did not run")
    figures["loop_lag_p99_ms"] = round(pct(lag, 0.99) * 1000, 1) if lag else None
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
