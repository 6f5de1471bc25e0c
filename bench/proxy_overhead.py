"""Per-call CPU overhead of the model proxy on a Claude-Code-sized conversation, with and
without the exact-token prefix cache, side by side in one run.

    .venv/bin/python bench/proxy_overhead.py [--conversations 2] [--repeat 3] [--max-tokens 100000]

What is measured, per call, through the proxy's own service functions (the code path of
POST /v1/messages minus HTTP, auth, the database and sampling):

* decode: json.loads of the request body + schema.messages_request_parse (the view does
  both in the worker pool before anything else);
* prepare: calls.message_prepare (adapter lookup, render, tokenize, fit, prefix-cache
  bookkeeping; worker-pool hops included), read from its own `render_ms`, the figure the
  proxy records in every capture. Three ways, on the same request, in this order:
    hit   - the conversation's prefix-cache entry is warm (the previous call of the
            conversation went through it): the proxy's steady state;
    miss  - a fresh, empty prefix cache (calls.prefix_cache swapped for the call): the
            adapter renders and tokenizes in full, helped only by its own cache of
            tokenized prompt chunks, which the miss calls of the earlier turns keep warm.
            This is the proxy without the prefix cache (or after its entry was evicted);
    cold  - a fresh prefix cache AND a fresh adapter (empty chunk cache): every token of
            the prompt is tokenized, as on the first call of a conversation in a process;
* parse: calls.message_sample with a scripted sampler that returns, at once, the ids
  of the conversation's next assistant turn (thinking, text, tool calls); its own
  `parse_ms` timing (stop-sequence check, adapter.parse, block finalization).

The conversation (bench/claude_code_request.py) starts like Claude Code's first call
(3 system blocks ~6 KB, 24 tools ~64 KB, a memory reminder) and grows one tool cycle per
call until the prompt passes --max-tokens. The route's window is set large enough that
nothing is fitted (cut). Figures are per prompt-size bucket of 10K tokens; the ratios are
of p50s. Prints figures; asserts nothing. Needs no database and no network: the Qwen3
tokenizer is provisioned offline under SYNTH_TOKENIZER_DIR if missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")

from bench.claude_code_request import Conversation  # noqa: E402

FAMILY = "qwen3"
BUCKET = 10_000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def fmt(values: list[float]) -> str:
    return f"{pct(values, 0.5):7.1f} {pct(values, 0.99):7.1f}" if values else f"{'-':>7} {'-':>7}"


@contextmanager
def fresh_adapter():
    """The registry's qwen3 adapter replaced by a new instance (empty caches) for a while."""
    from apps.proxy.adapters import registry
    from apps.proxy.tokenizers import tokenizer_load

    previous = registry._adapters.get(FAMILY)
    registry._adapters[FAMILY] = registry.ADAPTERS[FAMILY](tokenizer=tokenizer_load(FAMILY))
    try:
        yield
    finally:
        if previous is None:
            registry._adapters.pop(FAMILY, None)
        else:
            registry._adapters[FAMILY] = previous


@contextmanager
def prefix_cache_swapped(cache: Any):
    from apps.proxy import calls

    previous = calls.prefix_cache
    calls.prefix_cache = cache
    try:
        yield
    finally:
        calls.prefix_cache = previous


async def run(args: argparse.Namespace) -> None:
    from django.conf import settings

    from apps.accounts.models import Organization
    from apps.proxy import calls as call_pipeline
    from apps.proxy import pool, schema
    from apps.proxy.adapters.registry import adapter_for
    from apps.proxy.credentials import Caller
    from apps.proxy.models import ModelRoute
    from apps.proxy.prefix_cache import PrefixCache

    next_ids: list[int] = []
    route = ModelRoute(
        name="bench-overhead",
        family=FAMILY,
        tokenizer=FAMILY,
        context_window=1_000_000,  # never fit (cut): measure rendering, not fitting
        max_output=32_000,
        sampler_backend="scripted",
        sampler_config={"choose": lambda _prompt: list(next_ids)},
    )
    org = Organization(id="org_benchoverhead", slug="bench-overhead")
    caller = Caller(org=org, kind="operator", token_id="tok_benchoverhead")

    def ctx_for(conv: Conversation, request_id: str) -> call_pipeline.CallContext:
        return call_pipeline.CallContext(
            request_id=request_id,
            caller=caller,
            route=route,
            snapshot="",
            model_requested="claude-sonnet-4-5",
            session_id=conv.session_id,
        )

    adapter = adapter_for(FAMILY)
    # rows[bucket][column] -> ms samples
    rows: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    first_tokens: list[int] = []
    last_tokens: list[int] = []
    reused: list[float] = []
    first_cold: list[float] = []
    calls = 0
    started = time.perf_counter()
    for c in range(args.conversations):
        conv = Conversation(seed=c)
        warm = PrefixCache()
        tokens = 0
        turn = 0
        while tokens < args.max_tokens and turn < args.max_turns:
            body = json.dumps(conv.request(), ensure_ascii=False).encode()
            blocks = conv.assistant_blocks()
            next_ids[:] = adapter.render_assistant(blocks)
            for rep in range(args.repeat):
                t0 = time.perf_counter()
                request = schema.messages_request_parse(json.loads(body))
                decode_ms = (time.perf_counter() - t0) * 1000
                ctx = ctx_for(conv, f"req_bench_{c}_{turn}_{rep}")
                with prefix_cache_swapped(warm):
                    hit = await call_pipeline.message_prepare(ctx=ctx, request=request)
                with prefix_cache_swapped(PrefixCache()):
                    miss = await call_pipeline.message_prepare(ctx=ctx, request=request)
                with prefix_cache_swapped(PrefixCache()), fresh_adapter():
                    cold = await call_pipeline.message_prepare(ctx=ctx, request=request)
                ticket = pool.generation.reserve(caller=caller.key)
                completion = await call_pipeline.message_sample(prepared=hit, ticket=ticket)
                calls += 1
                tokens = len(hit.fitted.rendered.token_ids)
                if list(miss.fitted.rendered.token_ids) != list(hit.fitted.rendered.token_ids):
                    print(f"  note: conversation {c} turn {turn}: prefix-cache ids differ from a full render")
                if turn == 0:  # no completed assistant turn yet: nothing to reuse on any path
                    first_cold.append(cold.render_ms)
                    continue
                row = rows[tokens // BUCKET]
                row["decode"].append(decode_ms)
                row["hit"].append(hit.render_ms)
                row["miss"].append(miss.render_ms)
                row["cold"].append(cold.render_ms)
                row["parse"].append(completion.timings["parse_ms"])
                row["hit_total"].append(hit.render_ms + completion.timings["parse_ms"])
                row["miss_total"].append(miss.render_ms + completion.timings["parse_ms"])
                reused.append(hit.reused_ids / max(1, tokens))
            if turn == 0:
                first_tokens.append(tokens)
            conv.advance(blocks)
            turn += 1
        last_tokens.append(tokens)
        print(
            f"conversation {c}: {turn} calls, prompt {first_tokens[-1]:,} -> {tokens:,} tokens, "
            f"request body {len(body) / 1024:,.0f} KB at the end"
        )
    elapsed = time.perf_counter() - started

    print()
    print(
        f"per-call proxy CPU time (ms), Qwen3 adapter, {args.conversations} conversation(s) x {args.repeat} "
        f"repeat(s), calls 2.. of each conversation, {settings.SYNTH_PROXY_CPU_WORKERS} pool workers; p50 p99 per column; "
        f"ratios are of p50s"
    )
    header = (
        f"{'prompt tokens':>15} {'n':>4} | {'decode':^15} | {'prepare: hit':^15} | {'miss':^15} | "
        f"{'cold':^15} | {'parse':^15} | {'miss/hit':>8} {'cold/hit':>8}"
    )
    print(header)
    print("-" * len(header))
    for bucket in sorted(rows):
        row = rows[bucket]
        hit_p50 = pct(row["hit"], 0.5)
        label = f"{bucket * BUCKET // 1000}-{(bucket + 1) * BUCKET // 1000}K"
        print(
            f"{label:>15} {len(row['hit']):>4} | {fmt(row['decode'])} | {fmt(row['hit'])} | {fmt(row['miss'])} | "
            f"{fmt(row['cold'])} | {fmt(row['parse'])} | {pct(row['miss'], 0.5) / hit_p50:8.2f} "
            f"{pct(row['cold'], 0.5) / hit_p50:8.2f}"
        )
    every = {k: [v for row in rows.values() for v in row[k]] for k in ("hit_total", "miss_total", "hit", "miss")}
    print()
    print(
        f"prompt tokens: first call {', '.join(f'{t:,}' for t in first_tokens)}; "
        f"last call {', '.join(f'{t:,}' for t in last_tokens)}"
    )
    print(
        f"first call of a conversation (no entry to reuse), cold prepare: p50 {pct(first_cold, 0.5):.1f} ms "
        f"p99 {pct(first_cold, 0.99):.1f} ms"
    )
    print(
        f"per call, prepare + parse, all sizes: with prefix cache p50 {pct(every['hit_total'], 0.5):.1f} ms "
        f"p99 {pct(every['hit_total'], 0.99):.1f} ms; without p50 {pct(every['miss_total'], 0.5):.1f} ms "
        f"p99 {pct(every['miss_total'], 0.99):.1f} ms; ratio of p50s "
        f"{pct(every['miss_total'], 0.5) / pct(every['hit_total'], 0.5):.2f}"
    )
    if reused:
        print(f"prefix-cache reuse on calls after the first: mean {statistics.mean(reused):.1%} of prompt ids")
    tools = tools_render()
    print(
        f"the request's {tools['tools']} tools written into the system turn, p50 of 300: by json on every call "
        f"{tools['tools_json_ms']:.3f} ms, through the adapters' memo {tools['tools_memo_ms']:.3f} ms"
    )
    print(f"{calls} measured calls in {elapsed:.1f} s")
    print(
        json.dumps(
            {
                "calls": calls,
                "prepare_hit_p50_ms": round(pct(every["hit"], 0.5), 2),
                "prepare_miss_p50_ms": round(pct(every["miss"], 0.5), 2),
                "prepare_parse_hit_p50_ms": round(pct(every["hit_total"], 0.5), 2),
                "prepare_parse_miss_p50_ms": round(pct(every["miss_total"], 0.5), 2),
                "first_call_cold_p50_ms": round(pct(first_cold, 0.5), 2),
                **tools,
                "load_average": [round(v, 2) for v in os.getloadavg()],
            }
        )
    )


def tools_render() -> dict[str, Any]:
    """Writing Claude Code's tools into Qwen3's system turn, as json every call (what the
    template does) and through the memo the adapters render them with."""
    from apps.proxy.adapters import qwen
    from apps.proxy.adapters.messages import to_chat_messages

    _, tools = to_chat_messages(Conversation(seed=0, size="claude-code").request())
    figures: dict[str, Any] = {"tools": len(tools)}
    for key, render in (("tools_json_ms", qwen.tool_lines.__wrapped__), ("tools_memo_ms", qwen.tool_lines)):  # type: ignore[attr-defined]
        times = []
        for _ in range(300):
            started = time.perf_counter()
            render(tools)
            times.append((time.perf_counter() - started) * 1000)
        figures[key] = round(statistics.median(times), 3)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=2, help="independent conversations (seeds)")
    parser.add_argument("--repeat", type=int, default=3, help="measurements of each call")
    parser.add_argument("--max-tokens", type=int, default=100_000, help="grow each conversation to this prompt size")
    parser.add_argument("--max-turns", type=int, default=500, help="hard stop on calls per conversation")
    args = parser.parse_args()

    import django

    django.setup()
    from apps.proxy.tokenizers import provision, provisioned_status

    if provisioned_status(FAMILY) is not None:
        print(f"provisioning the {FAMILY} tokenizer ...")
        provision([FAMILY])
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
