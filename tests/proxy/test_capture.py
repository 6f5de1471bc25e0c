"""Capture: staged before the response completes, settled after, published and verified;
read back through /api/interactions; the captured prompt re-renders to the same ids."""

from __future__ import annotations

import asyncio
import hashlib
import json
from urllib.parse import urlparse

import orjson
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core.management import call_command
from django.core.signals import request_finished
from django.db import close_old_connections
from django.test import AsyncRequestFactory

from apps.objects.models import StoredObject
from apps.objects.services import object_read
from apps.proxy import calls, capture, views
from apps.proxy.adapters.registry import adapter_for
from apps.proxy.models import Delivery, Eligibility, Integrity, Interaction, ModelRoute
from apps.proxy.samplers.base import Sampler, SampleRequest, SampleResult
from synth_common.canonical import canonical_bytes
from tests.conftest import make_member
from tests.proxy.conftest import call, encode, issue, make_route, scripted

pytestmark = pytest.mark.django_db

TOOL_CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "pytest -q"}}\n</tool_call><|im_end|>'


@pytest.fixture
def alice():
    return make_member("team", "alice")


def body(**extra) -> dict:
    return {
        "model": "sonnet",
        "max_tokens": 100,
        "system": "You are a coding agent.",
        "tools": [{"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
        "messages": [{"role": "user", "content": "run the tests"}],
        **extra,
    }


def post(path: str, data: dict, secret: str, **headers):
    factory = AsyncRequestFactory()
    return factory.post(
        path, data=json.dumps(data), content_type="application/json", headers={"x-api-key": secret, **headers}
    )


def test_stream_is_staged_before_content_and_settled_after_message_stop(alice, qwen3_tokenizer, published):
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "Running them.\n" + TOOL_CALL))
    secret = issue(alice.org, "qwen3-test", trial="trl_1", run="run_1")

    async def scenario():
        response = await views.messages_view(post("/v1/messages", body(stream=True), secret))
        seen, chunks = [], 0
        async for chunk in response.streaming_content:
            chunks += 1
            rows = await sync_to_async(lambda: list(Interaction.objects.values("integrity", "delivery")))()
            for line in chunk.decode().splitlines():
                if line.startswith("event: "):
                    seen.append((line.removeprefix("event: "), rows))
        return seen, chunks

    seen, chunks = async_to_sync(scenario)()
    # The opening events in one chunk, the whole answer (known at once) in another: one
    # send each, not one per event.
    assert chunks == 2, seen
    assert [event for event, _ in seen][-1] == "message_stop"
    by_event = dict(seen)
    assert by_event["message_start"] == []  # nothing sampled yet
    staged = {"integrity": Integrity.STAGED, "delivery": Delivery.PENDING}
    assert by_event["content_block_start"] == [staged]
    assert by_event["message_stop"] == [staged]  # staged before message_stop; delivered only after
    interaction = Interaction.objects.get()
    assert interaction.delivery == Delivery.DELIVERED and interaction.delivered_at is not None
    assert interaction.eligibility == Eligibility.ELIGIBLE
    assert published == [interaction.id]
    assert interaction.stop_reason == "tool_use" and interaction.stream is True


def test_json_is_staged_before_it_is_returned(alice, qwen3_tokenizer, published):
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "All green.<|im_end|>"))
    secret = issue(alice.org, "qwen3-test")
    response = async_to_sync(views.messages_view)(post("/v1/messages", body(), secret))
    assert response.status_code == 200
    interaction = Interaction.objects.get()
    assert (interaction.integrity, interaction.delivery) == (Integrity.STAGED, Delivery.PENDING)
    assert interaction.payload["content"] == [{"type": "text", "text": "All green."}]
    assert published == []
    request_finished.disconnect(close_old_connections)  # as Django's test client does
    try:
        response.close()  # what the ASGI server does once the body is sent
    finally:
        request_finished.connect(close_old_connections)
    interaction.refresh_from_db()
    assert interaction.delivery == Delivery.DELIVERED and published == [interaction.id]


def test_payload_is_complete_and_re_renders_to_the_same_ids(alice, qwen3_tokenizer):
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "<think>\nok\n</think>\n\nRunning.\n" + TOOL_CALL))
    secret = issue(alice.org, "qwen3-test", trial="trl_9", run="run_9")
    headers = {"x-claude-code-session-id": "s-1", "anthropic-beta": "a-1,b-2", "x-synth-trial": "trl_9"}
    r = call("/v1/messages", secret=secret, body=body(thinking={"type": "adaptive"}), headers=headers)
    assert r.status == 200
    interaction = Interaction.objects.get()
    payload = capture.staged_payload(interaction=interaction)
    assert payload["format"] == "synth.interaction/1" and payload["id"] == interaction.id
    assert (payload["run_id"], payload["trial_id"], payload["session_id"]) == ("run_9", "trl_9", "s-1")
    assert payload["route"]["name"] == "qwen3-test" and payload["snapshot"]["backend"] == "scripted"
    assert payload["anthropic_beta"] == ["a-1", "b-2"]
    sampled = encode(qwen3_tokenizer, "<think>\nok\n</think>\n\nRunning.\n" + TOOL_CALL)
    assert payload["output_ids"] == sampled and payload["logprobs"] == [0.0] * len(sampled)
    assert payload["finish"] == "stop" and payload["stop_reason"] == "tool_use"
    assert [b["type"] for b in payload["content"]] == ["thinking", "text", "tool_use"]
    assert set(payload["timings"]) >= {"queue_ms", "render_ms", "sample_ms", "parse_ms", "total_ms"}
    assert interaction.prompt_tokens == len(payload["prompt_ids"]) and interaction.output_tokens == len(sampled)
    # Re-rendering the captured (effective) request reproduces the sampled prompt exactly.
    rerendered = adapter_for("qwen3").render(request=json.loads(payload["request_json"])).token_ids
    assert list(rerendered) == payload["prompt_ids"]


def test_a_large_staged_payload_is_stored_lz4_compressed_and_reads_back_whole(alice, qwen3_tokenizer):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("TOAST compression is PostgreSQL's")
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "Done.<|im_end|>"))
    secret = issue(alice.org, "qwen3-test")
    # A long conversation's request: its JSON text is what makes a staged payload large.
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"step {i}: " + "ls -la " * 200} for i in range(41)
    ]
    r = call("/v1/messages", secret=secret, body=body(messages=history))
    assert r.status == 200
    interaction = Interaction.objects.get()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_column_compression(payload), pg_column_size(payload), octet_length(payload::text) "
            "FROM proxy_interaction WHERE id = %s",
            [interaction.id],
        )
        method, stored, text_size = cursor.fetchone()
    assert method == "lz4" and text_size > 50_000 and stored < text_size / 3
    payload = capture.staged_payload(interaction=interaction)
    captured = json.loads(payload["request_json"])["messages"]  # the effective request: text blocks
    assert [(m["role"], m["content"][0]["text"]) for m in captured] == [(h["role"], h["content"]) for h in history]


def test_fitting_is_recorded_and_the_effective_prompt_captured(alice):
    make_route(context_window=900, max_output=100)
    huge = "\n".join(f"log line {i} " + "x" * 40 for i in range(300))
    messages = [
        {"role": "user", "content": "check"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": huge}]},
    ]
    r = call("/v1/messages", secret=alice.secret, body=body(messages=messages, max_tokens=4000, stream=True))
    assert r.status == 200 and r.events()[-1][0] == "message_stop", r.body
    interaction = Interaction.objects.get()
    payload = capture.staged_payload(interaction=interaction)
    assert interaction.fitted and payload["fitting"][0]["tool_use_id"] == "toolu_1"
    assert payload["original_prompt_tokens"] > 800 >= len(payload["prompt_ids"])
    assert payload["sampling"] == {
        **payload["sampling"],
        "max_tokens": 100,
        "max_tokens_requested": 4000,
    }
    fitted_text = json.loads(payload["request_json"])["messages"][2]["content"][0]["content"]
    assert "characters omitted by the proxy to fit the context window" in fitted_text
    assert (
        list(adapter_for("qwen3").render(request=json.loads(payload["request_json"])).token_ids)
        == payload["prompt_ids"]
    )
    # interactive use is captured but not learning material
    assert interaction.principal_kind == "operator" and interaction.eligibility == Eligibility.INELIGIBLE


def test_client_disconnect_during_sampling(alice, qwen3_tokenizer, monkeypatch, published, settings):
    class Slow(Sampler):
        async def sample(self, request: SampleRequest) -> SampleResult:
            await asyncio.sleep(30)
            raise AssertionError("not reached")

    async def slow(*, route, snapshot):
        return Slow()

    monkeypatch.setattr(calls, "sampler_get", slow)
    settings.SYNTH_PROXY_PING_SECONDS = 0.02
    make_route()
    secret = issue(alice.org, "qwen3-test")

    async def scenario():
        response = await views.messages_view(post("/v1/messages", body(stream=True), secret))
        events = response._iterator  # the view's own generator, as the server drives it
        assert (await events.__anext__()).startswith(b"event: message_start")
        assert (await events.__anext__()).startswith(b"event: ping")
        await events.aclose()  # the client went away

    async_to_sync(scenario)()
    interaction = Interaction.objects.get()
    assert interaction.delivery == Delivery.CLIENT_DISCONNECTED
    assert interaction.eligibility == Eligibility.INELIGIBLE and "disconnected" in interaction.eligibility_reason
    assert interaction.payload["output_ids"] == [] and capture.staged_payload(interaction=interaction)["prompt_ids"]
    assert published == [interaction.id]
    from apps.proxy import pool

    assert pool.generation.stats() == {"active": 0, "waiting": 0, "reserved": 0}


def test_sampler_failure_is_recorded_as_failed(alice, monkeypatch):
    class Broken(Sampler):
        async def sample(self, request: SampleRequest) -> SampleResult:
            raise RuntimeError("CUDA out of memory")

    async def broken(*, route, snapshot):
        return Broken()

    monkeypatch.setattr(calls, "sampler_get", broken)
    make_route()
    r = call("/v1/messages", secret=issue(alice.org, "qwen3-test"), body=body())
    assert r.status == 500 and r.json()["error"]["type"] == "api_error"
    interaction = Interaction.objects.get()
    assert interaction.delivery == Delivery.FAILED and "CUDA" in interaction.delivery_error
    assert interaction.eligibility == Eligibility.INELIGIBLE


def test_publish_uploads_create_only_and_verifies(alice, qwen3_tokenizer):
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "Fine.<|im_end|>"))
    call("/v1/messages", secret=issue(alice.org, "qwen3-test"), body=body())
    interaction = Interaction.objects.get()
    staged_payload = capture.staged_payload(interaction=interaction)
    assert capture.interaction_publish(interaction_id=interaction.id) == Integrity.VERIFIED
    interaction.refresh_from_db()
    data = canonical_bytes(staged_payload)
    assert interaction.integrity == Integrity.VERIFIED and interaction.payload is None
    assert interaction.prompt_ids_packed is None  # the staged prompt is cleared with the payload
    assert interaction.payload_sha256 == hashlib.sha256(data).hexdigest() and interaction.payload_size == len(data)
    stored = StoredObject.objects.get(org=alice.org, sha256=interaction.payload_sha256)
    # The published bytes alone reproduce the prompt: re-render their request.
    published_payload = json.loads(object_read(obj=stored))
    rerendered = adapter_for("qwen3").render(request=json.loads(published_payload["request_json"]))
    assert list(rerendered.token_ids) == published_payload["prompt_ids"]
    # Idempotent: a redelivered task changes nothing.
    assert capture.interaction_publish(interaction_id=interaction.id) == Integrity.VERIFIED
    assert capture.interaction_publish(interaction_id="int_missing") == "missing"


def test_publishing_for_a_learner_returns_the_bytes_it_verified(alice, qwen3_tokenizer):
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "Fine.<|im_end|>"))
    call("/v1/messages", secret=issue(alice.org, "qwen3-test"), body=body())
    interaction = Interaction.objects.get()
    expected = canonical_bytes(capture.staged_payload(interaction=interaction))
    state, data = capture.interaction_evidence(interaction_id=interaction.id)
    interaction.refresh_from_db()
    assert state == Integrity.VERIFIED and interaction.integrity == Integrity.VERIFIED and data == expected
    assert object_read(obj=StoredObject.objects.get(org=alice.org, sha256=interaction.payload_sha256)) == data
    # Verified before: nothing was read now, the caller reads the object itself.
    assert capture.interaction_evidence(interaction_id=interaction.id) == (Integrity.VERIFIED, None)
    # Published but not verified (a publisher died between its two moves): verified now.
    Interaction.objects.filter(pk=interaction.id).update(integrity=Integrity.PUBLISHED, verified_at=None)
    assert capture.interaction_evidence(interaction_id=interaction.id) == (Integrity.VERIFIED, expected)


def test_sweeper_settles_abandoned_rows_and_requeues_staged(alice, qwen3_tokenizer, published):
    from datetime import timedelta

    from django.utils import timezone

    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "a<|im_end|>"))
    response = async_to_sync(views.messages_view)(post("/v1/messages", body(), issue(alice.org, "qwen3-test")))
    assert response.status_code == 200  # never closed: as if the server died mid-send
    Interaction.objects.update(created_at=timezone.now() - timedelta(hours=1))
    assert capture.staged_sweep() == 1
    interaction = Interaction.objects.get()
    assert interaction.delivery == Delivery.FAILED and interaction.delivery_error == "never settled"
    assert published == [interaction.id, interaction.id]


# CONTROL API
# ------------------------------------------------------------------------------


def test_interactions_api_scoped_by_org(alice, qwen3_tokenizer):
    bob = make_member("rival", "bob")
    make_route(backend="scripted", config={**scripted(qwen3_tokenizer, "x<|im_end|>"), "cycle": True})
    # (streamed: the stream settles delivery itself, in this thread's transaction)
    call("/v1/messages", secret=issue(alice.org, "qwen3-test", trial="trl_a", run="run_a"), body=body(stream=True))
    call("/v1/messages", secret=issue(alice.org, "qwen3-test", trial="trl_b", run="run_a"), body=body(stream=True))
    call("/v1/messages", secret=issue(bob.org, "qwen3-test", trial="trl_c", run="run_c"), body=body(stream=True))

    listed = alice.client.get("/api/interactions").json()
    assert {i["trial"] for i in listed["results"]} == {"trl_a", "trl_b"} and "next" in listed
    only = alice.client.get("/api/interactions", {"run": "run_a", "trial": "trl_b"}).json()["results"]
    assert [i["trial"] for i in only] == ["trl_b"]
    assert alice.client.get("/api/interactions", {"run": "run_c"}).json()["results"] == []

    target = Interaction.objects.get(trial_id="trl_a")
    detail = alice.client.get(f"/api/interactions/{target.id}").json()
    assert detail["integrity"]["state"] == "staged" and detail["delivery"]["state"] == "delivered"
    assert detail["payload"]["inline"]["prompt_ids"] and detail["payload"]["download"] is None
    assert detail["eligibility"] == {"state": "eligible", "reason": None}

    capture.interaction_publish(interaction_id=target.id)
    detail = alice.client.get(f"/api/interactions/{target.id}").json()
    assert detail["integrity"]["state"] == "verified" and detail["payload"]["inline"] is None
    url = urlparse(detail["payload"]["download"]["url"])
    fetched = alice.client.get(f"{url.path}?{url.query}")
    content = b"".join(fetched.streaming_content) if fetched.streaming else fetched.content
    assert hashlib.sha256(content).hexdigest() == detail["integrity"]["sha256"]
    assert json.loads(content)["trial_id"] == "trl_a"

    # Another org's interaction does not exist for bob; unauthenticated is 401.
    assert bob.client.get(f"/api/interactions/{target.id}").status_code == 404
    assert bob.client.get("/api/interactions/int_nope").status_code == 404
    assert {i["trial"] for i in bob.client.get("/api/interactions").json()["results"]} == {"trl_c"}
    from rest_framework.test import APIClient

    assert APIClient().get("/api/interactions").status_code == 401


def test_models_api(alice):
    make_route("qwen3-a", trainable=True)
    make_route("qwen3-b", inference_enabled=False)
    results = alice.client.get("/api/models").json()["results"]
    assert results[0] == {
        "name": "qwen3-a",
        "family": "qwen3",
        "context_window": 32768,
        "max_output": 4096,
        "trainable": True,
        "inference_enabled": True,
        "aliases": ["claude-*", "sonnet", "opus", "haiku"],
    }
    assert [r["name"] for r in results] == ["qwen3-a", "qwen3-b"]


def test_route_add_command():
    call_command("route_add", "--default")
    route = ModelRoute.objects.get(name="qwen3-8b")
    assert (route.family, route.sampler_backend, route.sampler_config) == (
        "qwen3",
        "local",
        {"family": "qwen3", "tiny": True, "seed": 0},
    )
    assert route.trainable and route.inference_enabled and "claude-*" in route.aliases
    call_command("route_add", "qwen3-8b", "--max-output", "2048")  # idempotent update
    assert ModelRoute.objects.get(name="qwen3-8b").max_output == 2048
    call_command(
        "route_add",
        "vllm-qwen",
        "--family",
        "qwen3",
        "--context-window",
        "65536",
        "--max-output",
        "8192",
        "--backend",
        "openai",
        "--config",
        '{"base_url": "http://vllm:8000", "model": "q"}',
        "--no-inference",
    )
    vllm = ModelRoute.objects.get(name="vllm-qwen")
    assert vllm.tokenizer == "qwen3" and not vllm.inference_enabled and not vllm.trainable


def test_admin_pages_render(admin_client, alice, qwen3_tokenizer):
    from django.urls import reverse

    from apps.accounts.models import ModelCredential

    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "ok<|im_end|>"))
    call("/v1/messages", secret=issue(alice.org, "qwen3-test"), body=body())
    for model in (ModelRoute, Interaction, ModelCredential):
        meta = model._meta
        assert admin_client.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")).status_code == 200
        obj = model.objects.get()
        page = admin_client.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk]))
        assert page.status_code == 200
        assert "prompt_ids" not in page.content.decode()  # payloads are never rendered in the admin


def test_client_disconnect_after_staging(alice, qwen3_tokenizer, published):
    make_route(backend="scripted", config=scripted(qwen3_tokenizer, "A long answer " * 50 + "<|im_end|>"))
    secret = issue(alice.org, "qwen3-test")

    async def scenario():
        response = await views.messages_view(post("/v1/messages", body(stream=True), secret))
        events = response._iterator
        while b"event: content_block_delta" not in await events.__anext__():
            pass
        await events.aclose()

    async_to_sync(scenario)()
    interaction = Interaction.objects.get()
    assert interaction.delivery == Delivery.CLIENT_DISCONNECTED and interaction.payload["output_ids"]
    assert interaction.integrity == Integrity.STAGED and published == [interaction.id]


# COMPACT PROMPTS: packed ids, deltas on the conversation's previous call
# ------------------------------------------------------------------------------


def record(org, route, ids: list[int], *, session: str = "s-1", agent: str = "") -> capture.CaptureRecord:
    """A capture of a call whose prompt was `ids` (no proxy call: the ids are the test's)."""
    return capture.CaptureRecord(
        org_id=org.id,
        principal_kind="attempt",
        credential_id="mcr_test",
        token_id="",
        run_id="run_1",
        trial_id="trl_1",
        correlation_id="trl_1",
        session_id=session,
        agent_id=agent,
        parent_agent_id="",
        request_id="req_1",
        route_id=route.id,
        route={"name": route.name, "family": route.family},
        model_requested="sonnet",
        stream=True,
        snapshot={"backend": "scripted"},
        request={"messages": [{"role": "user", "content": "go"}]},
        sampling={"max_tokens": 10},
        fitting=[],
        original_prompt_tokens=len(ids),
        prompt_ids=ids,
        prompt_reused_ids=0,
        output_ids=[7, 8, 151645],
        logprobs=[-0.25, -1.0e-7, -3.3333333333333335],
        finish="stop",
    )


def ids_of(n: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    # Ids beyond 16 bits, and one beyond 31, so a narrow or signed packing would show.
    return [rng.randrange(152_000) for _ in range(n - 1)] + [2**31 + seed]


@pytest.fixture
def stage(django_capture_on_commit_callbacks):
    """Stage as the proxy does, each row committed (so it may be the next call's base)."""

    def run(rec: capture.CaptureRecord, **kw) -> Interaction:
        with django_capture_on_commit_callbacks(execute=True):
            interaction = capture.interaction_stage(rec=rec, **kw)
        return Interaction.objects.get(pk=interaction.pk)

    return run


def published_ids(interaction: Interaction) -> list[int]:
    assert capture.interaction_publish(interaction_id=interaction.id) == Integrity.VERIFIED
    interaction.refresh_from_db()
    stored = StoredObject.objects.get(org=interaction.org, sha256=interaction.payload_sha256)
    return json.loads(object_read(obj=stored))["prompt_ids"]


def test_a_session_of_extending_calls_is_staged_as_deltas(alice, stage):
    route = make_route()
    prompts = [ids_of(20_000, 0)]
    for turn in range(1, 6):  # each call: the previous prompt, then its answer and a new observation
        prompts.append(prompts[-1] + ids_of(300 * turn, turn))
    rows = [stage(record(alice.org, route, ids)) for ids in prompts]

    assert rows[0].prompt_base_id is None and rows[0].prompt_depth == 0
    assert len(rows[0].prompt_ids_packed) == 4 * len(prompts[0]) and "prompt_ids" not in rows[0].payload
    for previous, row, ids, before in zip(rows, rows[1:], prompts[1:], prompts, strict=False):
        assert (row.prompt_base_id, row.prompt_shared) == (previous.id, len(before))
        assert len(row.prompt_ids_packed) == 4 * (len(ids) - len(before))  # only what is new
        assert row.prompt_depth == previous.prompt_depth + 1
    for row, ids in zip(rows, prompts, strict=True):
        assert capture.staged_payload(interaction=row)["prompt_ids"] == ids
        assert row.prompt_tokens == len(ids)
    # Published out of order: a base published first is read from its object.
    for index in (2, 0, 5, 1, 4, 3):
        assert published_ids(rows[index]) == prompts[index]
        assert Interaction.objects.get(pk=rows[index].pk).prompt_ids_packed is None


def test_a_call_that_does_not_extend_the_previous_one(alice, stage):
    route = make_route()
    first = ids_of(40_000, 1)
    base = stage(record(alice.org, route, first))
    # History rewritten at 90% (past the first compared chunks): a delta sharing exactly that.
    cut = 36_001
    rewritten = first[:cut] + ids_of(5_000, 2)
    partial = stage(record(alice.org, route, rewritten))
    assert (partial.prompt_base_id, partial.prompt_shared) == (base.id, cut)
    # A new conversation in the same session (compaction): shares too little, a snapshot.
    fresh = first[:100] + ids_of(30_000, 3)
    snapshot = stage(record(alice.org, route, fresh))
    assert snapshot.prompt_base_id is None and snapshot.prompt_depth == 0
    # A shorter prompt that is a prefix of the previous one: a delta with nothing new.
    shorter = stage(record(alice.org, route, fresh[:20_000]))
    assert (shorter.prompt_base_id, shorter.prompt_shared, bytes(shorter.prompt_ids_packed)) == (
        snapshot.id,
        20_000,
        b"",
    )
    # Another session, another agent: never each other's base.
    other = stage(record(alice.org, route, fresh, session="s-2"))
    subagent = stage(record(alice.org, route, fresh, agent="agent-2"))
    assert other.prompt_base_id is None and subagent.prompt_base_id is None
    for row, ids in [(base, first), (partial, rewritten), (snapshot, fresh), (shorter, fresh[:20_000])]:
        assert capture.staged_payload(interaction=row)["prompt_ids"] == ids
        assert published_ids(row) == ids


def test_shared_prefix_and_suffix_count_what_two_buffers_share():
    import random

    from apps.proxy.prompt_store import pack, shared_prefix, shared_suffix

    rng = random.Random(11)
    for _ in range(100):
        a = ids_of(rng.choice([1, 3, 20_000, 40_000]), rng.randrange(1000))  # 80 and 160 KB: chunks
        b = a[: rng.randrange(len(a) + 1)] if rng.random() < 0.4 else list(a)
        if b and rng.random() < 0.8:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(32)  # any byte of an id
        expected = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        assert shared_prefix(pack(a), pack(b)) == expected
        # Request texts: bytes, from either end, the suffix bounded (never past a prefix).
        x, y = pack(a), pack(b)
        assert shared_prefix(x, y, width=1) == next(
            (i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y))
        )
        most = rng.randrange(-1, len(x) + 2)
        tail = next((i for i, (p, q) in enumerate(zip(x[::-1], y[::-1], strict=False)) if p != q), min(len(x), len(y)))
        assert shared_suffix(x, y, most=most) == max(0, min(tail, most))


def test_delta_chains_are_bounded(alice, stage):
    from apps.proxy.prompt_store import MAX_DEPTH

    route = make_route()
    prompts = [ids_of(2_000, 0)]
    for turn in range(1, 2 * MAX_DEPTH + 4):
        prompts.append(prompts[-1] + ids_of(50, turn))
    rows = [stage(record(alice.org, route, ids)) for ids in prompts]
    depths = [row.prompt_depth for row in rows]
    expected = list(range(MAX_DEPTH + 1))
    assert depths == (expected * 3)[: len(rows)]  # a snapshot after MAX_DEPTH deltas
    assert [row.prompt_base_id is None for row in rows].count(True) == 3
    for row, ids in zip(rows, prompts, strict=True):
        assert capture.staged_payload(interaction=row)["prompt_ids"] == ids


@pytest.mark.django_db(transaction=True)
def test_concurrent_calls_of_one_session(alice):
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    route = make_route()
    common = ids_of(30_000, 8)
    first = capture.interaction_stage(rec=record(alice.org, route, common))  # autocommit: a base at once
    prompts = [common + ids_of(200 + 10 * i, 100 + i) for i in range(8)]

    def stage_one(ids: list[int]) -> str:
        try:
            return capture.interaction_stage(rec=record(alice.org, route, ids)).id
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        staged = list(pool.map(stage_one, prompts))
    rows = {row.id: row for row in Interaction.objects.filter(pk__in=staged)}
    ids_by_row = dict(zip(staged, prompts, strict=True))
    # Each is a delta on the first call or on a sibling staged just before it.
    assert all(row.prompt_base_id in {first.id, *staged} and row.prompt_shared >= 30_000 for row in rows.values())
    for row_id, ids in ids_by_row.items():
        assert capture.staged_payload(interaction=rows[row_id])["prompt_ids"] == ids
    for row_id in reversed(staged):  # publication clears bases under later rows
        assert published_ids(rows[row_id]) == ids_by_row[row_id]


def test_an_uncommitted_call_is_never_a_base(alice, stage):
    route = make_route()
    first = ids_of(3_000, 4)
    capture.interaction_stage(rec=record(alice.org, route, first))  # not committed (yet)
    second = stage(record(alice.org, route, first + [1, 2, 3]))
    assert second.prompt_base_id is None


def test_a_base_whose_prompt_cannot_be_read_falls_back_to_re_rendering_the_request(
    alice, qwen3_tokenizer, django_capture_on_commit_callbacks
):
    make_route(backend="scripted", config={**scripted(qwen3_tokenizer, "Looking.<|im_end|>"), "cycle": True})
    secret = issue(alice.org, "qwen3-test")
    headers = {"x-claude-code-session-id": "s-9"}
    first = body()
    second = body(
        messages=[
            *first["messages"],
            {"role": "assistant", "content": "Looking."},
            {"role": "user", "content": "and now the linter"},
        ]
    )
    rows = []
    for request in (first, second):
        with django_capture_on_commit_callbacks(execute=True):
            assert call("/v1/messages", secret=secret, body=request, headers=headers).status == 200
        rows.append(Interaction.objects.order_by("-created_at", "-id").first())
    base, delta = rows
    assert delta.prompt_base_id == base.id and delta.prompt_shared > 0
    expected = capture.staged_payload(interaction=delta)["prompt_ids"]
    assert (
        expected[: delta.prompt_shared] == capture.staged_payload(interaction=base)["prompt_ids"][: delta.prompt_shared]
    )
    # The base's prompt altered before the delta was published (its request, on which the
    # delta's request is staged, still reads back): the rebuilt prompt fails its sha256.
    Interaction.objects.filter(pk=base.pk).update(prompt_ids_packed=bytes(4) + bytes(base.prompt_ids_packed)[4:])
    assert delta.payload["request_json_delta"]["base"] == base.id
    assert published_ids(delta) == expected


def test_an_unrebuildable_prompt_is_an_error_not_a_wrong_prompt(alice, stage):
    from apps.proxy.prompt_store import PromptUnrecoverable

    route = make_route()
    first = ids_of(3_000, 5)
    base = stage(record(alice.org, route, first))
    delta = stage(record(alice.org, route, first + [9, 9, 9]))
    assert delta.prompt_base_id == base.id
    # A base altered behind its back: the rebuilt prompt fails its sha256, and this
    # record's request does not re-render to its ids either.
    Interaction.objects.filter(pk=base.pk).update(prompt_ids_packed=bytes(4) + bytes(base.prompt_ids_packed)[4:])
    with pytest.raises(PromptUnrecoverable):
        capture.interaction_publish(interaction_id=delta.id)
    assert Interaction.objects.get(pk=delta.pk).integrity == Integrity.STAGED  # the sweeper retries it


def test_the_published_object_is_the_one_staged_before_compact_prompts(alice, stage):
    route = make_route()
    first = ids_of(10_000, 6)
    stage(record(alice.org, route, first))
    rec = record(alice.org, route, first + ids_of(500, 7))
    compact = stage(rec)
    assert compact.prompt_base_id is not None
    legacy = stage(rec, compact=False)  # the same call staged as before: the ids in the JSON payload
    assert legacy.prompt_ids_packed is None and legacy.payload["prompt_ids"] == rec.prompt_ids
    before = canonical_bytes({**legacy.payload, "id": compact.id})
    assert capture.interaction_publish(interaction_id=compact.id) == Integrity.VERIFIED
    compact.refresh_from_db()
    assert object_read(obj=StoredObject.objects.get(org=alice.org, sha256=compact.payload_sha256)) == before
    assert compact.payload_sha256 == hashlib.sha256(before).hexdigest()
    # Rows staged before compact prompts still publish as they did.
    assert published_ids(legacy) == rec.prompt_ids
    assert legacy.payload_sha256 == hashlib.sha256(canonical_bytes(legacy_payload(legacy, rec))).hexdigest()


def growing_requests(turns: int) -> list[dict]:
    """A harness's requests, each the previous one's messages and then its answer and a new
    observation, the system prompt and tools sent after the messages (as Claude Code does),
    the cache marker moved to the last message, text beyond ASCII throughout."""
    tools = [
        {"name": f"Tool{i}", "description": "d\u00e9j\u00e0 vu \u2603 " * 40, "input_schema": {"b": 1, "a": 2}}
        for i in range(20)
    ]
    messages: list[dict] = []
    requests = []
    for turn in range(turns):
        for message in messages:
            message["content"][-1].pop("cache_control", None)
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"turn {turn} \U0001f600 " * 50}]})
        messages.append({"role": "user", "content": [{"type": "text", "text": f"output {turn}: caf\u00e9 " * 400}]})
        messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        requests.append(
            json.loads(json.dumps({"model": "sonnet", "messages": messages, "system": "be brief", "tools": tools}))
        )
    return requests


def test_a_session_of_extending_requests_is_staged_as_deltas(alice, stage):
    route = make_route()
    prompts = [ids_of(5_000, 0)]
    requests = growing_requests(6)
    for turn in range(1, len(requests)):
        prompts.append(prompts[-1] + ids_of(200, turn))
    rows = []
    for ids, request in zip(prompts, requests, strict=True):
        rec = record(alice.org, route, ids)
        rec.request = request
        rows.append(stage(rec))

    assert "request_json_delta" not in rows[0].payload
    for previous, row, request, before in zip(rows, rows[1:], requests[1:], requests, strict=False):
        text = capture._request_bytes(request)
        delta = row.payload["request_json_delta"]
        assert "request_json" not in row.payload and delta["base"] == previous.id
        # What is stored is the new messages and the moved cache marker; the tools after
        # the messages are shared.
        assert len(delta["middle"].encode()) < len(text) - len(capture._request_bytes(before)) + 100
        assert delta["suffix"] > 10_000
        assert delta["sha256"] == hashlib.sha256(text).hexdigest()
    for row, request in zip(rows, requests, strict=True):
        assert json.loads(capture.staged_payload(interaction=row)["request_json"]) == request
    # Published out of order: a base published first is read from its object.
    for index in (2, 0, 5, 1, 4, 3):
        assert published_ids(rows[index]) == prompts[index]
        stored = StoredObject.objects.get(
            org=alice.org, sha256=Interaction.objects.get(pk=rows[index].pk).payload_sha256
        )
        payload = json.loads(object_read(obj=stored))
        assert "request_json_delta" not in payload
        assert payload["request_json"] == capture._request_bytes(requests[index]).decode()


def test_request_deltas_cut_between_characters_and_only_when_they_share_enough():
    from apps.proxy.prompt_store import StagedPrompt, request_delta

    def delta(base: str, text: str) -> dict | None:
        staged = StagedPrompt(
            packed=b"", base_id="int_base", shared=1, depth=1, sha256="", whole=b"", base_request=base.encode()
        )
        return request_delta(staged=staged, request=text.encode())

    def rebuilt(base: str, d: dict) -> str:
        raw = base.encode()
        return (raw[: d["prefix"]] + d["middle"].encode() + raw[len(raw) - d["suffix"] :]).decode()

    common = "x" * 1000
    # The first differing byte is inside a character (\u00e9 and \u00e8 share their lead
    # byte), and so is the last (\u00f3 and \u0173 share their continuation byte).
    for base, text in [
        (common + "\u00e9" + common, common + "\u00e8" + common),
        (common + "\u00f3" + common, common + "\u0173" + common),
        (common + "\U0001f600" + common, common + "\U0001f601\U0001f602" + common),
        (common, common + "\u00e9"),
        (common + "\u00e9", common),
    ]:
        d = delta(base, text)
        assert d is not None and rebuilt(base, d) == text
        assert d["prefix"] + len(d["middle"].encode()) + d["suffix"] == len(text.encode())
        assert len(d["middle"]) <= 2
    assert delta(common, "y" * 2000) is None  # shares nothing: staged whole
    assert delta("x" * 400 + "y" * 600, "x" * 400 + "z" * 600) is None  # 40%: staged whole
    unrelated = StagedPrompt(packed=b"", base_id=None, shared=None, depth=0, sha256="", whole=b"", base_request=b"x")
    assert request_delta(staged=unrelated, request=b"x") is None  # a snapshot prompt: the request whole


def test_an_unrebuildable_request_is_an_error_not_a_wrong_request(alice, stage):
    from apps.proxy.prompt_store import PromptUnrecoverable

    route = make_route()
    first, second = growing_requests(2)
    rows = []
    for ids, request in ((ids_of(3_000, 5), first), (ids_of(3_000, 5) + [9, 9], second)):
        rec = record(alice.org, route, ids)
        rec.request = request
        rows.append(stage(rec))
    base, delta = rows
    assert delta.payload["request_json_delta"]["base"] == base.id
    # The base's text altered behind its back: the rebuilt text fails its sha256.
    altered = {**base.payload, "request_json": base.payload["request_json"].replace("sonnet", "sonneT")}
    Interaction.objects.filter(pk=base.pk).update(payload=altered)
    with pytest.raises(PromptUnrecoverable, match="does not match its sha256"):
        capture.interaction_publish(interaction_id=delta.id)
    Interaction.objects.filter(pk=base.pk).delete()
    with pytest.raises(PromptUnrecoverable, match="is gone"):
        capture.interaction_publish(interaction_id=delta.id)
    assert Interaction.objects.get(pk=delta.pk).integrity == Integrity.STAGED  # the sweeper retries it


def legacy_payload(interaction: Interaction, rec: capture.CaptureRecord) -> dict:
    logprobs, _ = capture.finite_floats(rec.logprobs)
    return json.loads(
        json.dumps(capture._payload(interaction.id, rec, logprobs, capture._request_bytes(rec.request).decode()))
    )


def test_settling_the_row_it_staged_reads_nothing_and_settles_once(alice, published, django_assert_num_queries):
    # The proxy settles the row it holds from staging: one conditional UPDATE, no read; the
    # eligibility still follows from what was staged, and only a pending row moves.
    route = make_route()
    judge = record(alice.org, route, ids_of(50, 1))
    judge.role = "judge"
    rows = [capture.interaction_stage(rec=rec) for rec in (record(alice.org, route, ids_of(50, 0)), judge)]
    with django_assert_num_queries(2):
        for row in rows:
            capture.interaction_settle(interaction_id=row.id, delivery=Delivery.DELIVERED, staged=row)
    actor, judged = (Interaction.objects.get(pk=row.id) for row in rows)
    assert (actor.delivery, actor.eligibility) == (Delivery.DELIVERED, Eligibility.ELIGIBLE)
    assert (judged.delivery, judged.eligibility) == (Delivery.DELIVERED, Eligibility.INELIGIBLE)
    assert judged.eligibility_reason == "a judge's call (it assessed the attempt)"
    assert published == [actor.id, judged.id]

    capture.interaction_settle(interaction_id=actor.id, delivery=Delivery.FAILED, error="late", staged=rows[0])
    actor.refresh_from_db()
    assert actor.delivery == Delivery.DELIVERED and published == [actor.id, judged.id]
    with pytest.raises(ValueError, match="is not"):
        capture.interaction_settle(interaction_id=actor.id, delivery=Delivery.FAILED, staged=rows[1])


def test_calls_that_settle_together_share_one_phase_and_one_update_per_outcome(alice, published, monkeypatch):
    """The proxy's settles gather while one is written (apps.proxy.delivery._SETTLES): the
    calls that settle in one turn are one database phase and one UPDATE per outcome, those
    that settle while it runs are the next phase's batch; every row gets its own outcome
    and eligibility and is published once, and a row already settled is neither moved nor
    published again."""
    import threading

    from apps.proxy import delivery

    route = make_route()
    recs = [record(alice.org, route, ids_of(40, n), session=f"s-{n}") for n in range(7)]
    recs[3].role = "judge"
    rows = [capture.interaction_stage(rec=rec) for rec in recs]
    outcomes = [Delivery.DELIVERED] * 4 + [Delivery.CLIENT_DISCONNECTED] + [Delivery.DELIVERED] * 2

    phases: list[list[str]] = []
    claims: list[tuple[str, int]] = []
    first_running, later_joined = threading.Event(), threading.Event()
    real_settle, real_claim = capture.interactions_settle, capture.DELIVERY_TRANSITIONS.claim_each

    def settle(*, settlements):
        phases.append([s.interaction_id for s in settlements])
        if len(phases) == 1:  # the first write runs: the later calls settle meanwhile
            first_running.set()
            assert later_joined.wait(timeout=60)
        return real_settle(settlements=settlements)

    def claim_each(**kw):
        moved = real_claim(**kw)
        claims.append((kw["to"], len(moved)))
        return moved

    monkeypatch.setattr(capture, "interactions_settle", settle)
    monkeypatch.setattr(capture.DELIVERY_TRANSITIONS, "claim_each", claim_each)

    async def settle_all() -> None:
        first = [
            asyncio.ensure_future(
                delivery._settle_shielded(interaction_id=row.id, delivery=outcome, error="", staged=row)
            )
            for row, outcome in zip(rows[:5], outcomes[:5], strict=True)
        ]
        await asyncio.get_running_loop().run_in_executor(None, first_running.wait)
        later = [
            asyncio.ensure_future(
                delivery._settle_shielded(interaction_id=row.id, delivery=outcome, error="", staged=row)
            )
            for row, outcome in zip(rows[5:], outcomes[5:], strict=True)
        ]
        await asyncio.sleep(0)  # the later settles have joined the next batch
        later_joined.set()
        await asyncio.gather(*first, *later)

    async_to_sync(settle_all)()
    assert phases == [[row.id for row in rows[:5]], [row.id for row in rows[5:]]]
    # First batch: delivered and eligible (3), the judge's (1), the disconnected one (1).
    assert sorted(claims[:3]) == sorted([(Delivery.DELIVERED, 3), (Delivery.DELIVERED, 1), ("client_disconnected", 1)])
    assert claims[3:] == [(Delivery.DELIVERED, 2)]
    settled = {row.id: Interaction.objects.get(pk=row.id) for row in rows}
    for row, outcome in zip(rows, outcomes, strict=True):
        got = settled[row.id]
        assert got.delivery == outcome
        assert (got.delivered_at is not None) == (outcome == Delivery.DELIVERED)
        expected = (
            Eligibility.ELIGIBLE if outcome == Delivery.DELIVERED and row.role == "actor" else Eligibility.INELIGIBLE
        )
        assert got.eligibility == expected
    assert settled[rows[4].id].delivery_error == ""
    assert sorted(published) == sorted(row.id for row in rows)

    # Settled already (by the same call's other path, or a sweeper): nothing moves, nothing
    # is published twice.
    async_to_sync(delivery._settle_shielded)(
        interaction_id=rows[0].id, delivery=Delivery.CLIENT_DISCONNECTED, error="late", staged=rows[0]
    )
    assert Interaction.objects.get(pk=rows[0].id).delivery == Delivery.DELIVERED
    assert sorted(published) == sorted(row.id for row in rows)


def test_the_request_text_loads_back_to_the_request_in_its_key_order():
    """The staged request_json is written by orjson; json writes what orjson refuses (an
    integer beyond 64 bits). Either way it loads back to the request, keys in their order
    (the template writes tool schemas and arguments in that order)."""
    from apps.core.inputs import json_loads_strict

    body = (
        '{"system": "caf\\u00e9 \\u2603 \\ud83d\\ude00 tab\\t nl\\n", "max_tokens": 9, '
        '"tools": [{"name": "Bash", "input_schema": {"type": "object", "z": 1.5e300, "a": -0.0, "m": [1e-7, 2]}}], '
        '"messages": [{"role": "user", "content": [{"type": "text", "text": "</script> \\\\ \\"q\\" \\u0001"}]}]}'
    )
    request = json_loads_strict(body)
    text = capture._request_bytes(request)
    assert json.loads(text) == request and list(json.loads(text)["tools"][0]["input_schema"]) == ["type", "z", "a", "m"]
    assert text == orjson.dumps(request)  # the fast path, not the fallback
    wide = {"metadata": {"n": 2**70}, "messages": []}
    assert json.loads(capture._request_bytes(wide)) == wide
