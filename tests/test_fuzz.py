"""Fuzz every route of the URL conf: bad input is a 4xx in its surface's JSON shape, never a
5xx and never an HTML page.

Routes come from the URL conf itself (/v1 and /api, the admin and the browsable docs pages
aside), with the methods each view defines; bodies from the OpenAPI schema's request
components where there is one (and from the plan schemas and valid seeds for the endpoints
that take free-form objects), otherwise generic JSON. Then values are swapped for the kinds
of input that used to become 500s: NUL bytes, lone surrogates, floats where integers go,
huge numbers, oversized strings, deep nesting, wrong types; in bodies, keys, query strings,
path parameters and headers.

/api goes through the WSGI handler (as the gateway serves it), /v1 through the ASGI one (as
the proxy does); both with raise_request_exception=False, so that a server error is a
response to count rather than an exception in the test.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from typing import Any
from urllib.parse import quote

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client
from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.generators import SchemaGenerator
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.accounts.services import worker_get_or_create, worker_token_issue
from apps.runs.leases import lease_claim
from apps.runs.models import Run, RunStatus
from apps.runs.plans import PLAN_SCHEMAS
from apps.runs.services import run_schedule
from synth_project.errors import is_openai_path
from tests.conftest import make_member
from tests.factories import make_dataset_version, make_profile_version
from tests.proxy.conftest import _isolate, make_route, qwen3_tokenizer  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db

SKIPPED_PREFIXES = ("admin/", "api/docs/", "api/redoc/")
METHODS = ("get", "post", "put", "patch", "delete")
BODY_METHODS = ("post", "put", "patch")
# Raw JSON text put in place of a marker string after encoding: what json.dumps cannot write.
DEEP, DEEPER = "\u2063deep\u2063", "\u2063deeper\u2063"
HUGE_INT, HUGE_FLOAT = "\u2063int\u2063", "\u2063float\u2063"
RAW = {
    json.dumps(DEEP): "[" * 100 + "]" * 100,  # within /v1's bound, beyond /api's
    json.dumps(DEEPER): "[" * 900 + "]" * 900,
    json.dumps(HUGE_INT): "9" * 5000,
    json.dumps(HUGE_FLOAT): "1e400",
}
BAD_TEXT = ["\x00", "a\x00b", "\ud800", "x\udfffy", "\udc80\udc81"]
BAD_VALUES = st.one_of(
    st.sampled_from(BAD_TEXT),
    st.sampled_from([2.0, 1.5, -0.0, 1e308, 5e-324]),  # floats where integers go
    st.sampled_from([10**30, -(10**30), 2**63, -1, 0]),  # huge and edge integers
    st.sampled_from(["x" * 70_000, DEEP, DEEPER, HUGE_INT, HUGE_FLOAT]),  # oversized, deep, unparseable
    st.none() | st.booleans() | st.just([]) | st.just({}) | st.text(max_size=8),  # wrong types
)
BAD_QUERY = st.sampled_from([*BAD_TEXT, "2.0", "-1", "0", "1e400", "9" * 40, "x" * 5000, "", "٢"])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10,
)
# Query parameters the views read, besides those the OpenAPI schema lists. Not "follow":
# a followed event stream polls until its run ends and closes the test's connection.
QUERY_KEYS = ["limit", "cursor", "after", "wait", "timeout", "status", "kind", "run", "trial", "sig", "format"]

STATS: Counter[str] = Counter()


# ROUTES
# ------------------------------------------------------------------------------


def _regex_part(pattern: Any) -> str:
    return pattern.regex.pattern.removeprefix("^").removesuffix(r"\Z").removesuffix("$")


def _routes(patterns: list[Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for entry in patterns:
        regex = prefix + _regex_part(entry.pattern)
        if isinstance(entry, URLResolver):
            out += _routes(entry.url_patterns, regex)
        elif isinstance(entry, URLPattern) and not regex.startswith(SKIPPED_PREFIXES):
            out.append((regex, entry.callback))
    return out


def _methods(view: Any) -> list[str]:
    cls = getattr(view, "view_class", None) or getattr(view, "cls", None)
    if cls is None:  # the /v1 function views: each answers its own method and refuses the rest
        return ["get", "post"]
    return [m for m in METHODS if hasattr(cls, m)]


_GROUP = re.compile(r"\(\?P<(\w+)>[^)]*\)")


def _template(regex: str) -> str:
    """The route as "/api/runs/{run_id}" (regex escapes undone)."""
    return "/" + re.sub(r"\\(.)", r"\1", _GROUP.sub(lambda m: "{" + m.group(1) + "}", regex))


# BODIES
# ------------------------------------------------------------------------------


def schema_values(schema: dict[str, Any], components: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Mostly valid values of a (JSON or OpenAPI) schema: types, bounds, enums, patterns."""
    if "$ref" in schema:
        return schema_values(components[schema["$ref"].rsplit("/", 1)[1]], components)
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "object" and schema.get("properties"):
        props = {k: schema_values(v, components) for k, v in schema["properties"].items() if not v.get("readOnly")}
        required = {k: v for k, v in props.items() if k in schema.get("required", [])}
        return st.fixed_dictionaries(required, optional={k: v for k, v in props.items() if k not in required})
    if kind == "integer":
        return st.integers(schema.get("minimum", -5), schema.get("maximum", 10**6))
    if kind == "number":
        low = schema.get("exclusiveMinimum", schema.get("minimum", -100))
        high = schema.get("maximum", 10**6)
        return st.floats(low, high, exclude_min="exclusiveMinimum" in schema, allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True)
        return st.text(max_size=min(schema.get("maxLength", 20), 20))
    if kind == "array":
        return st.lists(schema_values(schema.get("items", {}), components), max_size=3)
    return JSON_VALUES


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: Any, base: st.SearchStrategy[Any]) -> Any:
    """A value of ``base`` with one to three places spoiled: a string gets a bad character,
    a value is swapped for a bad one, or a bad key is added."""
    body = copy.deepcopy(draw(base))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(body)))
        if not path:
            return draw(BAD_VALUES)
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        value, how = parent[path[-1]], draw(st.sampled_from(["spoil", "swap", "key"]))
        if how == "spoil" and isinstance(value, str):
            parent[path[-1]] = value + draw(st.sampled_from(BAD_TEXT))
        elif how == "key" and isinstance(parent, dict):
            parent[draw(st.sampled_from(BAD_TEXT))] = value
        else:
            parent[path[-1]] = draw(BAD_VALUES)
    return body


def encode(body: Any) -> bytes:
    text = json.dumps(body)  # ensure_ascii: lone surrogates become \ud800 escapes, as a client sends them
    for marker, raw in RAW.items():
        text = text.replace(marker, raw)
    return text.encode()


# THE WORLD
# ------------------------------------------------------------------------------


VALID_MESSAGE = {
    "model": "qwen3-test",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "hi"}],
    "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
}
VALID_CHAT = {
    "model": "qwen3-test",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "hi"}],
    "tools": [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}],
}
VALID_RECIPE = {
    "engine": {"name": "command", "version": "1"},
    "command": ["sh", "-c", "echo ${task.name}"],
    "workdir": "${task.workdir}",
    "env": {"LEVEL": "1"},
    "limits": {"timeout_sec": 60, "max_model_calls": 10},
}


class World(dict):
    def __repr__(self) -> str:  # what a failing example prints: not the whole OpenAPI schema
        return "world"


@pytest.fixture
def world(settings) -> dict[str, Any]:
    """Members, a worker, a route, a finished run and an active lease to aim at."""
    settings.DEBUG = False
    alice = make_member("team", "alice")
    make_route()
    dsv = make_dataset_version(org=alice.org)
    actor = make_profile_version(org=alice.org)
    run_body = {"kind": "evaluate", "dataset": dsv.reference, "actor": {"profile": actor.profile.name}}
    finished = alice.client.post("/api/runs", run_body, format="json").json()["id"]
    Run.objects.filter(pk=finished).update(status=RunStatus.SUCCEEDED)
    run_schedule(run_id=alice.client.post("/api/runs", run_body, format="json").json()["id"])
    worker = worker_get_or_create(name="fuzz-worker")
    lease = lease_claim(worker=worker)
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return World(
        {
            "member": alice.secret,
            "worker": worker_token_issue(worker=worker).secret,
            "params": {
                "run_id": [finished],
                "lease_id": [lease.id if lease else "lse_none"],
                "name": [actor.profile.name],
                "version": [str(actor.version)],
                "org": ["team"],
                "model_id": ["qwen3-test"],
                "task_version_id": [dsv.entries.first().task_version_id],
                "sha256": [dsv.entries.first().task_version.digest],
            },
            "openapi": schema,
            "seeds": {
                "/api/runs": run_body,
                "/api/runs/{run_id}/regrade": {"judge": {"profile": actor.profile.name}, "plan": {}},
                "/api/profiles/{name}/versions": VALID_RECIPE,
                "/v1/messages": VALID_MESSAGE,
                "/v1/messages/count_tokens": {k: v for k, v in VALID_MESSAGE.items() if k != "max_tokens"},
                "/v1/chat/completions": VALID_CHAT,
            },
        }
    )


def _body_strategy(world: dict[str, Any], template: str, method: str, *, bad: bool) -> st.SearchStrategy[Any]:
    seed = world["seeds"].get(template)
    if template == "/api/runs":
        plan = schema_values(PLAN_SCHEMAS["evaluate"], {})
        base: st.SearchStrategy[Any] = plan.map(lambda p: {**seed, "plan": p})
    elif seed is not None:
        base = st.just(seed)
    else:
        operation = world["openapi"]["paths"].get(template, {}).get(method, {})
        content = operation.get("requestBody", {}).get("content", {}).get("application/json")
        components = world["openapi"]["components"]["schemas"]
        base = schema_values(content["schema"], components) if content else JSON_VALUES
    if bad:  # mostly broken versions of a valid body
        return st.one_of(base, mutated(base), mutated(base), mutated(base), JSON_VALUES)
    return st.one_of(base, mutated(base), JSON_VALUES)


# REQUESTS
# ------------------------------------------------------------------------------


def _path(draw: Any, world: dict[str, Any], template: str, *, good: bool) -> str:
    def value(match: re.Match[str]) -> str:
        known = st.sampled_from(world["params"].get(match.group(1), ["x"]))
        raw = draw(known if good else known | BAD_QUERY | st.text(max_size=12))
        return quote(raw.encode("utf-8", "surrogatepass"), safe="")

    return re.sub(r"\{(\w+)\}", value, template)


def _query(draw: Any, world: dict[str, Any], template: str, method: str) -> str:
    operation = world["openapi"]["paths"].get(template, {}).get(method, {})
    known = [p["name"] for p in operation.get("parameters", []) if p["in"] == "query" and p["name"] != "follow"]
    pairs = draw(st.lists(st.tuples(st.sampled_from(known + QUERY_KEYS), BAD_QUERY | st.text(max_size=6)), max_size=3))
    return "&".join(f"{quote(k)}={quote(v.encode('utf-8', 'surrogatepass'), safe='')}" for k, v in pairs)


@st.composite
def requests(draw: Any, world: dict[str, Any], routes: list[tuple[str, list[str]]], *, bodies: bool) -> dict[str, Any]:
    """A request to one of ``routes``; with ``bodies``, to a method that takes one, with the
    path's own ids, so that the body is what gets tested."""
    template, methods = draw(st.sampled_from(routes))
    method = draw(st.sampled_from(methods))
    headers = {}
    who = draw(st.sampled_from(["member", "member", "worker", "none"]))
    if template.startswith("/api/worker"):
        who = draw(st.sampled_from(["worker", "worker", "member"]))
    if who != "none":
        headers["authorization"] = f"Bearer {world[who]}"
    if draw(st.integers(0, 4)) == 0:
        name = draw(st.sampled_from(["Idempotency-Key", "Last-Event-ID", "x-claude-code-session-id"]))
        # On the wire a header is bytes: a lone surrogate arrives as its UTF-8 bytes, read as latin-1.
        headers[name] = draw(BAD_QUERY).encode("utf-8", "surrogatepass").decode("latin-1")
    body = draw(_body_strategy(world, template, method, bad=bodies)) if method in BODY_METHODS else None
    return {
        "method": method,
        "path": _path(draw, world, template, good=bodies),
        "query": "" if bodies else _query(draw, world, template, method),
        "headers": headers,
        "body": None if body is None else encode(body),
    }


def _send(req: dict[str, Any]) -> tuple[int, str, bytes]:
    """One request: /v1 through ASGI (consuming a stream), everything else through WSGI."""
    kwargs = {"QUERY_STRING": req["query"], "headers": req["headers"]}
    if req["body"] is not None:
        kwargs.update(data=req["body"], content_type="application/json")
    if req["path"].startswith("/v1"):

        async def run() -> tuple[int, str, bytes]:
            response = await getattr(AsyncClient(raise_request_exception=False), req["method"])(req["path"], **kwargs)
            if response.streaming:
                return (
                    response.status_code,
                    response["Content-Type"],
                    b"".join([c async for c in response.streaming_content]),
                )
            return response.status_code, response.get("Content-Type", ""), response.content

        return async_to_sync(run)()
    response = getattr(Client(raise_request_exception=False), req["method"])(req["path"], **kwargs)
    content = next(iter(response.streaming_content), b"") if response.streaming else response.content
    return response.status_code, response.get("Content-Type", ""), content


def _shape_ok(path: str, status: int, content: bytes) -> bool:
    if status < 400:
        return True
    try:
        body = json.loads(content)
    except ValueError:
        return False
    if is_openai_path(path):  # OpenAI's API paths answer in OpenAI's shape
        return set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    if path.startswith("/v1/models"):  # the views add OpenAI's param and code: both SDKs read it
        keys = set(body.get("error", {}))
        return body.get("type") == "error" and keys in ({"type", "message"}, {"type", "message", "param", "code"})
    if path.startswith("/v1"):
        return body.get("type") == "error" and set(body.get("error", {})) == {"type", "message"}
    return set(body.get("error", {})) == {"type", "message", "field"}


def _record(req: dict[str, Any], status: int, content_type: str, content: bytes) -> str:
    html = "html" in content_type or content.lstrip()[:15].lower().startswith((b"<!doctype", b"<html"))
    surface = "v1" if req["path"].startswith("/v1") else "api"
    STATS["requests"] += 1
    STATS[f"{surface} {status // 100}xx"] += 1
    STATS["5xx"] += status >= 500
    STATS["html"] += html
    STATS["bad shape"] += not _shape_ok(req["path"], status, content)
    return (
        f"{STATS['5xx']} 5xx, {STATS['html']} HTML bodies and {STATS['bad shape']} errors in another shape "
        f"in {STATS['requests']} requests ({dict(STATS)}); this one: {req['method'].upper()} {req['path']}?"
        f"{req['query'][:200]} {req['headers']} {(req['body'] or b'')[:300]!r} -> {status} {content[:500]!r}"
    )


@pytest.fixture
def routes() -> list[tuple[str, list[str]]]:
    found = [(_template(regex), _methods(view)) for regex, view in _routes(get_resolver().url_patterns)]
    assert any(t.startswith("/v1/") for t, _ in found) and sum(t.startswith("/api/") for t, _ in found) > 30
    return found


def _exchange(req: dict[str, Any]) -> None:
    status, content_type, content = _send(req)
    summary = _record(req, status, content_type, content)
    assert status < 500, summary
    assert "html" not in content_type and not content.lstrip()[:15].lower().startswith(b"<"), summary
    assert _shape_ok(req["path"], status, content), summary


# Derandomized: the same examples on every run, so that a pass means the same thing each time.
FUZZ = settings(max_examples=250, deadline=None, derandomize=True)


def _refused_on_both_surfaces() -> None:
    # Most of what the fuzz sends is refused, on both surfaces, each time with a JSON 4xx.
    assert STATS["api 4xx"] and STATS["v1 4xx"], str(dict(STATS))


def test_valid_requests_are_served(world):
    """The world the fuzz aims at is live: valid requests to both surfaces succeed (so the
    refusals below are the inputs' doing, not a broken set-up)."""
    member = {"authorization": f"Bearer {world['member']}"}
    valid = [
        {"method": "get", "path": "/v1/models", "query": "", "headers": member, "body": None},
        {"method": "post", "path": "/v1/messages", "query": "", "headers": member, "body": encode(VALID_MESSAGE)},
        {"method": "get", "path": "/api/runs", "query": "limit=5", "headers": member, "body": None},
        {
            "method": "get",
            "path": f"/api/runs/{world['params']['run_id'][0]}",
            "query": "",
            "headers": member,
            "body": None,
        },
    ]
    for req in valid:
        status, _content_type, content = _send(req)
        assert 200 <= status < 300, (req["method"], req["path"], status, content[:300])


def test_fuzz_every_route_and_method(world, routes):
    """Bad path parameters, query strings and headers everywhere (and bodies where they go)."""
    STATS.clear()

    @FUZZ
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        _exchange(data.draw(requests(world, routes, bodies=False)))

    fuzz()
    _refused_on_both_surfaces()


def test_fuzz_request_bodies(world, routes):
    """Bad bodies where bodies go: broken versions of valid ones, and arbitrary JSON."""
    STATS.clear()
    with_bodies = [(t, [m for m in methods if m in BODY_METHODS]) for t, methods in routes]

    @FUZZ
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        _exchange(data.draw(requests(world, [(t, ms) for t, ms in with_bodies if ms], bodies=True)))

    fuzz()
    _refused_on_both_surfaces()
