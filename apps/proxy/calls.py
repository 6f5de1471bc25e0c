"""The model call pipeline: caller + validated request -> prompt -> sample -> parse -> capture record.

    auth (credentials) -> route (scoped) -> adapter.render (native template, tools,
    thinking) -> tokenize (prefix cache) -> fit to the budget -> sampler.sample (ids +
    logprobs) -> adapter.parse (tool calls, reasoning) -> stop sequences -> blocks

CPU work (render, tokenize, fit, parse) runs in the worker pool (pool.run_cpu); the
sampler is awaited on the event loop (samplers never block it). Views stay thin: they
read HTTP, call these functions and write HTTP/SSE; delivery.py records what became of
the answer. Route writes are in routes.py, credentials in credentials.py.
"""

from __future__ import annotations

import array
import asyncio
import functools
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.proxy import pool
from apps.proxy.adapters.base import ChatAdapter, RenderedPrompt
from apps.proxy.adapters.template_base import TemplateAdapter
from apps.proxy.capture import CaptureRecord
from apps.proxy.credentials import Caller, route_authorize
from apps.proxy.errors import ApiError, InvalidRequest, Overloaded, ProxyError
from apps.proxy.fitting import Fitted, prompt_fit
from apps.proxy.models import ModelRoute
from apps.proxy.prefix_cache import TURN_MARKERS, CacheKey, Tokenized, chatml_tokenize
from apps.proxy.prefix_cache import cache as prefix_cache
from apps.proxy.samplers.base import Sampler, SampleRequest, SampleResult

logger = logging.getLogger(__name__)

BETA_HEADER_MAX = 50  # betas recorded per call
# Sampled answers up to this many tokens are parsed on the event loop (message_sample).
INLINE_PARSE_TOKENS = 256


@dataclass(frozen=True)
class CallContext:
    """Who calls which route, with the correlation headers Claude Code sends."""

    request_id: str
    caller: Caller
    route: ModelRoute
    snapshot: str
    model_requested: str
    session_id: str = ""
    agent_id: str = ""
    parent_agent_id: str = ""
    correlation_id: str = ""
    betas: tuple[str, ...] = ()
    protocol: str = "messages"  # the wire protocol of the call: messages, chat or responses

    @property
    def cache_key(self) -> CacheKey:
        return (
            self.caller.org.id,
            self.caller.key,
            self.route.name,
            self.route.tokenizer,
            self.session_id,
            self.agent_id,
        )


@dataclass
class Prepared:
    ctx: CallContext
    request: dict[str, Any]  # the validated request as sent (normalized)
    adapter: TemplateAdapter
    fitted: Fitted
    max_tokens: int
    reused_ids: int
    render_ms: float
    # What the sampler is asked for: temperature, top_p, top_k, seed (the request's, or the
    # plan's where the credential holds them), and "held": the keys the plan decided.
    sampling: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.fitted.rendered.token_ids)


@dataclass
class Completion:
    sample: SampleResult
    blocks: list[dict[str, Any]]
    stop_reason: str
    stop_sequence: str | None
    parse_errors: list[str]
    delivered_ids: int  # sampled ids the response stands for (fewer when a stop sequence cut it)
    timings: dict[str, float] = field(default_factory=dict)


def _header(headers: Any, name: str) -> str:
    return str(headers.get(name) or "").strip()


def call_context_build(
    *,
    caller: Caller,
    model: str,
    headers: Any,
    request_id: str,
    routes: Sequence[ModelRoute] | None = None,
    protocol: str = "messages",
) -> CallContext:
    """Resolve the route for this caller (scoping checks) and collect correlation headers.
    With `routes` (the proxy's route cache) it reads no database."""
    route, snapshot = route_authorize(caller=caller, model=model, routes=routes)
    betas = [b.strip() for b in _header(headers, "anthropic-beta").split(",") if b.strip()]
    return CallContext(
        request_id=request_id,
        caller=caller,
        route=route,
        snapshot=snapshot,
        model_requested=model,
        session_id=_header(headers, "x-claude-code-session-id"),
        agent_id=_header(headers, "x-claude-code-agent-id"),
        parent_agent_id=_header(headers, "x-claude-code-parent-agent-id"),
        correlation_id=_header(headers, "x-synth-trial"),
        betas=tuple(betas[:BETA_HEADER_MAX]),
        protocol=protocol,
    )


# ADAPTERS AND SAMPLERS
# ------------------------------------------------------------------------------


def adapter_get(*, route: ModelRoute) -> TemplateAdapter:
    """The route's family adapter, loaded once per process (the registry caches it).

    A route naming an unknown family or an unprovisioned tokenizer is the operator's
    misconfiguration, reported as an api_error that says what is wrong.
    """
    from apps.proxy.adapters.registry import adapter_for

    try:
        return adapter_for(route.family)
    except Exception as exc:  # noqa: BLE001 - KeyError, TokenizerNotProvisioned, ...
        logger.error("model route %s cannot load its adapter: %s", route.name, exc)
        raise ApiError(f"model route {route.name!r} is misconfigured: {exc}") from exc


async def adapter_ready(*, route: ModelRoute) -> TemplateAdapter:
    """``adapter_get`` with no thread hop once the process has the adapter (loaded at
    startup, apps.proxy.warmup); its first load runs in the worker pool."""
    from apps.proxy.adapters.registry import adapter_loaded

    adapter = adapter_loaded(route.family)
    if adapter is None:
        adapter = await pool.run_cpu(adapter_get, route=route)
    return adapter


def sampler_config(*, route: ModelRoute, snapshot: str) -> dict[str, Any]:
    """The route's sampler config, pointed at the snapshot an attempt is bound to.

    "" or "base" is the route as configured. Otherwise the snapshot names weights for the
    backend: a Tinker sampler path (``tinker://...``, as model_path), or a LoRA adapter for
    a local route: a training run's package in the object store (``object:sha256:<hex>``,
    unpacked once into SYNTH_WEIGHTS_CACHE_DIR) or a directory. An openai (vLLM) route
    with an ``adapter_root`` serves such a package too: unpacked there by digest, then
    loaded into the server (apps.proxy.samplers.vllm_lora). Other backends serve only
    their configured snapshot. May read the object store: call it off the event loop.
    """
    from apps.objects.packages import package_materialize, snapshot_sha256

    config = dict(route.sampler_config or {})
    if snapshot in ("", "base"):
        return config
    if route.sampler_backend == "tinker" and snapshot.startswith("tinker://"):
        return {**config, "model_path": snapshot}
    if route.sampler_backend == "openai" and snapshot.startswith("object:"):
        return _openai_adapter_config(route=route, config=config, snapshot=snapshot)
    if route.sampler_backend == "local":
        try:
            digest = snapshot_sha256(snapshot)
        except ValueError as exc:
            raise ApiError(str(exc)) from exc
        if digest is not None:
            directory = package_materialize(
                sha256=digest, cache_dir=Path(settings.SYNTH_WEIGHTS_CACHE_DIR), keep=settings.SYNTH_WEIGHTS_CACHE_KEEP
            )
            return {**config, "adapter_dir": str(directory)}
        if snapshot.startswith("/"):
            return {**config, "adapter_dir": snapshot}
    raise ApiError(f"model route {route.name!r} ({route.sampler_backend}) cannot serve snapshot {snapshot!r}")


def _openai_adapter_config(*, route: ModelRoute, config: dict[str, Any], snapshot: str) -> dict[str, Any]:
    """The package unpacked into the route's ``adapter_root`` (atomically, by digest) and
    the names the server knows it by: the adapter's name and its directory as the server
    sees it (``adapter_server_root``, when it mounts the directory elsewhere)."""
    from apps.objects.packages import package_materialize, snapshot_sha256
    from apps.proxy.samplers.vllm_lora import lora_name_for

    try:
        digest = snapshot_sha256(snapshot)
    except ValueError as exc:
        raise ApiError(str(exc)) from exc
    root = config.get("adapter_root")
    if digest is None or not root:
        raise ApiError(
            f"model route {route.name!r} (openai) cannot serve snapshot {snapshot!r}: its sampler_config needs "
            "adapter_root, a directory the vLLM server reads, to load checkpoints into it"
        )
    idle = float(config.get("adapter_idle_seconds", settings.SYNTH_PROXY_LORA_IDLE_SECONDS))
    # An unpacked adapter stays while the server may still read it (vLLM re-reads the files
    # of an adapter it evicted from its own cache): well past the idle time that unloads it.
    directory = package_materialize(
        sha256=digest,
        cache_dir=Path(root),
        keep=settings.SYNTH_WEIGHTS_CACHE_KEEP,
        prune_idle_seconds=max(600.0, 2 * idle),
    )
    server_root = config.get("adapter_server_root")
    # Absolute either way: the server resolves a relative path against its own directory.
    path = f"{str(server_root).rstrip('/')}/{digest}" if server_root else str(directory.resolve())
    return {**config, "lora_name": lora_name_for(sha256=digest), "lora_path": path}


def _sampler_for(route: ModelRoute, snapshot: str) -> Sampler:
    from apps.proxy.samplers.factory import sampler_build

    return sampler_build(backend=route.sampler_backend, config=sampler_config(route=route, snapshot=snapshot))


async def sampler_get(*, route: ModelRoute, snapshot: str) -> Sampler:
    # The route's own sampler, once built, from the process's cache on the loop: its config
    # is the route's (no package to materialize). Otherwise off the event loop: unpacking
    # weights and loading a model both block.
    if snapshot in ("", "base"):
        from apps.proxy.samplers.factory import sampler_cached

        sampler = sampler_cached(backend=route.sampler_backend, config=dict(route.sampler_config or {}))
        if sampler is not None:
            return sampler
    return await asyncio.to_thread(_sampler_for, route, snapshot)


# PROMPT
# ------------------------------------------------------------------------------


def _adapter_input(request: dict[str, Any]) -> dict[str, Any]:
    """What the adapter renders: the conversation and its options, nothing transport-level."""
    return {k: request[k] for k in ("system", "messages", "tools", "tool_choice", "thinking") if k in request}


def render_with_cache(
    *, adapter: TemplateAdapter, family: str, request: dict[str, Any], key: CacheKey | None
) -> RenderedPrompt:
    """Render; on a prefix-cache hit tokenize only the suffix (ids identical either way).

    Only families with exact reuse (TURN_MARKERS) take this path; the others render in
    full. A miss uses the adapter's complete rendering, so its ids are the authority.
    """
    if key is None or family not in TURN_MARKERS:
        return adapter.render(request=request)
    text = adapter.render_text(request=request)
    full: list[RenderedPrompt] = []

    def full_ids() -> list[int]:
        full.append(adapter.render(request=request))
        return list(full[0].token_ids)

    tokenized = prefix_cache.tokenize(
        key=key,  # type: ignore[arg-type]
        text=text,
        encode_suffix=lambda suffix: chatml_tokenize(adapter=adapter, text=suffix),
        full=full_ids,
    )
    return _Rendered(text=full[0].text if full else text, token_ids=tokenized.ids, tokenized=tokenized)


@dataclass(frozen=True)
class _Rendered(RenderedPrompt):
    tokenized: Tokenized | None = None  # how the prefix cache made token_ids

    @property
    def reused(self) -> int:
        return self.tokenized.reused if self.tokenized is not None else 0


def _turn_end_ids(adapter: ChatAdapter, family: str) -> tuple[int | None, list[int]]:
    markers = TURN_MARKERS.get(family)
    if markers is None:
        return None, []
    ids = adapter.encode(markers[1])
    return (ids[0] if len(ids) == 1 else None), adapter.encode(markers[2])


def _prepare_sync(
    *, ctx: CallContext, request: dict[str, Any], adapter: TemplateAdapter, max_tokens: int
) -> tuple[Fitted, int]:
    route = ctx.route
    budget = route.context_window - max_tokens
    key = ctx.cache_key

    def render(req: dict[str, Any]) -> RenderedPrompt:
        try:
            return render_with_cache(adapter=adapter, family=route.family, request=_adapter_input(req), key=key)
        except ProxyError:
            raise
        except Exception as exc:  # noqa: BLE001 - a request the template cannot render is the client's
            logger.info("render failed for %s: %r", route.name, exc, exc_info=True)
            raise InvalidRequest(f"messages: could not be rendered for {route.family}: {exc}") from exc

    fitted = prompt_fit(request=request, budget=budget, render=render)
    rendered = fitted.rendered
    if key is not None:
        turn_end_id, separator_ids = _turn_end_ids(adapter, route.family)
        prefix_cache.remember(
            key=key,
            family=route.family,
            text=rendered.text,
            ids=rendered.token_ids if isinstance(rendered.token_ids, list) else list(rendered.token_ids),
            turn_end_id=turn_end_id,
            separator_ids=separator_ids,
            tokenized=rendered.tokenized if isinstance(rendered, _Rendered) else None,
        )
    return fitted, rendered.reused if isinstance(rendered, _Rendered) else 0


async def message_prepare(*, ctx: CallContext, request: dict[str, Any], small: bool = False) -> Prepared:
    """Render, tokenize and fit the prompt. 400 prompt-too-long if it can't fit.

    ``small``: the request's body is small (apps.proxy.exchange.INLINE_BODY_BYTES), and it is
    rendered on the event loop, as it was decoded; a larger one in the worker pool, so that
    one long conversation cannot hold up every stream. A small render costs less than the
    thread hop, and in the pool it waited behind other calls' renders (200 sessions of the
    proxy bench, 7 interleaved pairs: CPU per call 4.25 -> 4.04 ms, TTFB p99 658 -> 466 ms,
    the loop's lag p99 118 -> 140 ms)."""
    route = ctx.route
    # Claude Code sends max_tokens 32000 for models it does not know; the route's limit
    # applies instead of refusing (recorded in the capture as sampling.max_tokens).
    # None (OpenAI's protocols, max_tokens absent): as many as the route allows.
    requested = request["max_tokens"]
    max_tokens = route.max_output if requested is None else min(requested, route.max_output)
    held = ctx.caller.credential.sampling if ctx.caller.credential is not None else {}
    if held.get("max_tokens") is not None:
        max_tokens = min(max_tokens, int(held["max_tokens"]))
    started = time.perf_counter()
    adapter = await adapter_ready(route=route)
    if small:
        fitted, reused = _prepare_sync(ctx=ctx, request=request, adapter=adapter, max_tokens=max_tokens)
    else:
        fitted, reused = await pool.run_cpu(
            _prepare_sync, ctx=ctx, request=request, adapter=adapter, max_tokens=max_tokens
        )
    sampling = call_sampling(request=request, held=held)
    if held.get("seed") is not None:
        seed = functools.partial(call_seed, attempt_seed=int(held["seed"]), prompt_ids=fitted.rendered.token_ids)
        sampling["seed"] = seed() if small else await pool.run_cpu(seed)
    return Prepared(
        ctx=ctx,
        request=request,
        adapter=adapter,
        fitted=fitted,
        max_tokens=max_tokens,
        reused_ids=reused,
        render_ms=(time.perf_counter() - started) * 1000,
        sampling=sampling,
    )


SAMPLING_HELD = ("temperature", "top_p", "top_k")


def call_sampling(*, request: dict[str, Any], held: dict[str, Any]) -> dict[str, Any]:
    """The call's temperature, top_p and top_k: the plan's where the attempt's credential
    holds them (a harness sends its own defaults, which must not change what the learner
    assumes was sampled), else the request's. The seed is the request's here; with a held
    seed, message_prepare replaces it with call_seed's."""
    sampling: dict[str, Any] = {
        key: held[key] if held.get(key) is not None else request.get(key) for key in SAMPLING_HELD
    }
    if sampling["temperature"] is None:
        sampling["temperature"] = 1.0
    sampling["seed"] = request.get("seed")
    sampling["held"] = sorted(key for key in (*SAMPLING_HELD, "max_tokens", "seed") if held.get(key) is not None)
    return sampling


def _sampling_record(prepared: Prepared) -> dict[str, Any]:
    """temperature, top_p, top_k (and seed) as sampled. Where the plan held a value, it is
    the one recorded, with "held" naming those keys and "requested" what the harness sent."""
    request, sampling = prepared.request, prepared.sampling
    held = sampling.get("held") or []
    record: dict[str, Any] = {key: sampling[key] if key in held else request.get(key) for key in SAMPLING_HELD}
    if sampling.get("seed") is not None:
        record["seed"] = sampling["seed"]
    if held:
        record["held"] = list(held)
        record["requested"] = {key: request.get(key) for key in held if key != "seed"}
    return record


def call_seed(*, attempt_seed: int, prompt_ids: Sequence[int]) -> int:
    """One call's sampling seed from its attempt's and its prompt: the same prompt in the same
    attempt samples the same tokens (a rerun reproduces an attempt; a client's retry is
    answered alike), and different prompts draw independent seeds."""
    digest = hashlib.sha256(attempt_seed.to_bytes(8, "little") + array.array("I", prompt_ids).tobytes()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


async def tokens_count(*, ctx: CallContext, request: dict[str, Any]) -> int:
    """Exact input tokens of the request as sent (no fitting: the client wants the truth)."""
    adapter = await adapter_ready(route=ctx.route)

    def count() -> int:
        try:
            return len(adapter.render(request=_adapter_input(request)).token_ids)
        except Exception as exc:  # noqa: BLE001
            raise InvalidRequest(f"messages: could not be rendered for {ctx.route.family}: {exc}") from exc

    return await pool.run_cpu(count)


# SAMPLING AND PARSING
# ------------------------------------------------------------------------------


def _signature(thinking: str) -> str:
    """An opaque signature for a thinking block (Claude Code echoes it back; we never
    need to verify it, but clients drop unsigned thinking blocks)."""
    digest = hmac.new(settings.SECRET_KEY.encode(), thinking.encode(), hashlib.sha256).hexdigest()
    return f"synth.{digest[:40]}"


def _finalize_blocks(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for block in blocks:
        block = dict(block)
        if block.get("type") == "thinking" and not block.get("signature"):
            block["signature"] = _signature(block.get("thinking", ""))
        if block.get("type") == "tool_use":
            block.setdefault("input", {})
            if not block.get("id"):
                block["id"] = f"toolu_{secrets.token_hex(12)}"
        if block.get("type") == "text" and not block.get("text"):
            continue  # Anthropic never sends empty text blocks
        out.append(block)
    return out


def _stop_sequence_cut(*, adapter: ChatAdapter, ids: list[int], stops: list[str]) -> tuple[int, str] | None:
    """(number of ids up to and including the one completing the earliest stop sequence,
    the sequence), or None. Binary search on decoded prefixes: O(log n) decodes."""
    if not stops or not ids:
        return None
    text = adapter.decode(ids)
    found = [(text.find(s), s) for s in stops if s in text]
    if not found:
        return None
    _, stop = min(found)
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if stop in adapter.decode(ids[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo, stop


def _parse(adapter: ChatAdapter, *, token_ids: list[int], stopped: bool, id_seed: str, tools: Any) -> Any:
    # id_seed keeps tool_use ids distinct for identical outputs in one conversation; the
    # request's tools let an adapter type arguments by schema (GLM writes them as text).
    return adapter.parse(token_ids=token_ids, stopped=stopped, id_seed=id_seed, tools=tools)


def _parse_sync(
    *, adapter: ChatAdapter, sample: SampleResult, stops: list[str], id_seed: str, tools: Any = None
) -> tuple[list[dict[str, Any]], str, str | None, list[str], int]:
    ids = list(sample.token_ids)
    cut = _stop_sequence_cut(adapter=adapter, ids=ids, stops=stops)
    if cut is None:
        parsed = _parse(adapter, token_ids=ids, stopped=sample.finish == "stop", id_seed=id_seed, tools=tools)
        return _finalize_blocks(parsed.blocks), parsed.stop_reason, None, list(parsed.parse_errors), len(ids)
    count, stop = cut
    parsed = _parse(adapter, token_ids=ids[:count], stopped=True, id_seed=id_seed, tools=tools)
    blocks = _finalize_blocks(parsed.blocks)
    # The response excludes the stop sequence itself (Anthropic's behaviour).
    for block in reversed(blocks):
        if block.get("type") == "text" and stop in block["text"]:
            block["text"] = block["text"][: block["text"].find(stop)]
            break
    blocks = [b for b in blocks if not (b.get("type") == "text" and not b.get("text"))]
    return blocks, "stop_sequence", stop, list(parsed.parse_errors), count


async def message_sample(*, prepared: Prepared, ticket: pool.Ticket) -> Completion:
    """Wait for a generation slot, sample, parse. Sampler failures become ProxyErrors."""
    from apps.proxy.samplers.factory import AdapterLoadFailed, SamplerError, SamplerUnavailable

    ctx = prepared.ctx
    request = prepared.request
    async with ticket:
        sampler = await sampler_get(route=ctx.route, snapshot=ctx.snapshot)
        started = time.perf_counter()
        try:
            sample = await sampler.sample(
                SampleRequest(
                    prompt_ids=prepared.prompt_ids,
                    max_tokens=prepared.max_tokens,
                    stop_token_ids=list(prepared.adapter.stop_token_ids()),
                    temperature=prepared.sampling["temperature"],
                    top_p=prepared.sampling["top_p"],
                    top_k=prepared.sampling["top_k"],
                    seed=prepared.sampling["seed"],
                )
            )
        except SamplerUnavailable as exc:
            retry = {"retry-after": str(int(exc.retry_after))} if exc.retry_after else None
            raise Overloaded(f"the model backend is unavailable: {exc}", headers=retry) from exc
        except AdapterLoadFailed as exc:
            logger.error("model route %s cannot load snapshot %s: %s", ctx.route.name, ctx.snapshot, exc)
            raise ApiError(f"model route {ctx.route.name!r} cannot load snapshot {ctx.snapshot!r}: {exc}") from exc
        except SamplerError as exc:
            raise ApiError(f"the model backend failed: {exc}") from exc
        sample_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    parse = functools.partial(
        _parse_sync,
        adapter=prepared.adapter,
        sample=sample,
        stops=request.get("stop_sequences") or [],
        id_seed=ctx.request_id,
        tools=request.get("tools"),
    )
    # A short answer (a tool call, a line of text) is parsed on the event loop: in the pool it
    # queued behind other calls' rendering (at 200 sessions, parse_ms median 4.8 ms through
    # the pool, 0.13 ms inline), and the GIL runs no parse beside the loop anyway.
    inline = len(sample.token_ids) <= INLINE_PARSE_TOKENS
    blocks, stop_reason, stop_sequence, parse_errors, delivered = parse() if inline else await pool.run_cpu(parse)
    parse_ms = (time.perf_counter() - started) * 1000
    return Completion(
        sample=sample,
        blocks=blocks,
        stop_reason=stop_reason,
        stop_sequence=stop_sequence,
        parse_errors=parse_errors,
        delivered_ids=delivered,
        timings={
            "queue_ms": round(ticket.waited_ms, 3),
            "render_ms": round(prepared.render_ms, 3),
            "sample_ms": round(sample_ms, 3),
            "parse_ms": round(parse_ms, 3),
        },
    )


# RESPONSES AND CAPTURE
# ------------------------------------------------------------------------------


def usage(*, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    # Prefix reuse is a tokenization saving, not a provider KV cache: no cache tokens.
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "service_tier": "standard",
    }


def message_body(*, message_id: str, prepared: Prepared, completion: Completion | None) -> dict[str, Any]:
    """The non-streaming response. `completion` None means max_tokens 0 (no sampling)."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": prepared.ctx.model_requested,
        "content": completion.blocks if completion else [],
        "stop_reason": completion.stop_reason if completion else "max_tokens",
        "stop_sequence": completion.stop_sequence if completion else None,
        "usage": usage(
            input_tokens=len(prepared.fitted.rendered.token_ids),
            output_tokens=completion.delivered_ids if completion else 0,
        ),
    }


def capture_record(
    *, prepared: Prepared, completion: Completion | None, error: str = "", total_ms: float | None = None
) -> CaptureRecord:
    ctx = prepared.ctx
    route = ctx.route
    request = prepared.fitted.request
    sample = completion.sample if completion else None
    timings = dict(completion.timings) if completion else {"render_ms": round(prepared.render_ms, 3)}
    if total_ms is not None:
        timings["total_ms"] = round(total_ms, 3)
    return CaptureRecord(
        org_id=ctx.caller.org.id,
        principal_kind=ctx.caller.kind,
        credential_id=ctx.caller.credential.id if ctx.caller.credential else "",
        role=ctx.caller.credential.role if ctx.caller.credential else "actor",
        token_id=ctx.caller.token_id,
        run_id=ctx.caller.run_id,
        trial_id=ctx.caller.trial_id,
        correlation_id=ctx.correlation_id,
        session_id=ctx.session_id,
        agent_id=ctx.agent_id,
        parent_agent_id=ctx.parent_agent_id,
        request_id=ctx.request_id,
        route_id=route.id,
        route={
            "name": route.name,
            "family": route.family,
            "tokenizer": route.tokenizer,
            "context_window": route.context_window,
            "max_output": route.max_output,
            "sampler_backend": route.sampler_backend,
            "snapshot": ctx.snapshot,
        },
        model_requested=ctx.model_requested,
        protocol=ctx.protocol,
        stream=bool(prepared.request.get("stream")),
        snapshot=dict(sample.snapshot) if sample else {},
        request=_adapter_input(request),
        sampling={
            "max_tokens": prepared.max_tokens,
            "max_tokens_requested": prepared.request["max_tokens"],
            **_sampling_record(prepared),
            "stop_sequences": prepared.request.get("stop_sequences") or [],
            "stop_token_ids": list(prepared.adapter.stop_token_ids()),
        },
        fitting=prepared.fitted.record,
        original_prompt_tokens=prepared.fitted.original_tokens,
        prompt_ids=prepared.prompt_ids,
        prompt_reused_ids=prepared.reused_ids,
        output_ids=list(sample.token_ids) if sample else [],
        delivered_output_ids=(
            completion.delivered_ids if completion and completion.delivered_ids != len(sample.token_ids) else None
        ),
        logprobs=list(sample.logprobs) if sample else [],
        finish=sample.finish if sample else "",
        content=completion.blocks if completion else [],
        stop_reason=completion.stop_reason if completion else "",
        stop_sequence=completion.stop_sequence if completion else None,
        parse_errors=completion.parse_errors if completion else [],
        timings=timings,
        error=error,
        betas=list(ctx.betas),
        metadata=dict(prepared.request.get("metadata") or {}),
    )
