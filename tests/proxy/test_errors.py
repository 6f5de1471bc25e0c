"""Anthropic-shaped errors for every refusal, and a fuzz test: malformed is 4xx, never 5xx."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.proxy import exchange, pool
from tests.conftest import make_member
from tests.proxy.conftest import assert_error, call, make_route

pytestmark = pytest.mark.django_db

VALID = {
    "model": "qwen3-test",
    "max_tokens": 16,
    "system": "Be brief.",
    "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"c": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
    ],
    "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto"},
    "thinking": {"type": "disabled"},
    "temperature": 0.5,
}


@pytest.fixture
def alice():
    return make_member("team", "alice")


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda b: b.pop("model"), "model"),
        (lambda b: b.pop("max_tokens"), "max_tokens"),
        (lambda b: b.pop("messages"), "messages"),
        (lambda b: b.update(max_tokens="10"), "max_tokens"),
        (lambda b: b.update(max_tokens=-1), "max_tokens"),
        (lambda b: b.update(messages="hi"), "messages"),
        (lambda b: b.update(messages=[]), "messages"),
        (lambda b: b["messages"].append({"role": "robot", "content": "x"}), "messages.3.role"),
        (lambda b: b["messages"][0].pop("content"), "messages.0.content"),
        (lambda b: b["messages"][1]["content"][0].pop("id"), "messages.1.content.0"),
        (lambda b: b.update(temperature=3), "temperature"),
        (lambda b: b.update(stream="yes"), "stream"),
        (lambda b: b.update(tools=[{"name": "x"}]), "tools.0.input_schema"),
        (lambda b: b.update(tool_choice={"type": "tool", "name": "nope"}), "tool_choice.name"),
        (lambda b: b.update(thinking={"type": "enabled", "budget_tokens": 10}), "thinking.budget_tokens"),
        (lambda b: b.update(stop_sequences=[""]), "stop_sequences"),
        (lambda b: b.update(system=[{"type": "image", "source": {}}]), "system.0.type"),
    ],
)
def test_invalid_requests_are_400(alice, mutate, fragment):
    make_route()
    body = copy.deepcopy(VALID)
    mutate(body)
    error = assert_error(call("/v1/messages", secret=alice.secret, body=body), 400, "invalid_request_error")
    assert fragment in error["error"]["message"]


@pytest.mark.parametrize("raw", [b"", b"{", b"[1, 2]", b"null", b'{"model": NaN}', b"\xff\xfe", b"[" * 100_000])
def test_bad_json_is_400(alice, raw):
    make_route()
    assert_error(call("/v1/messages", secret=alice.secret, raw=raw), 400, "invalid_request_error")
    assert_error(call("/v1/messages/count_tokens", secret=alice.secret, raw=raw), 400, "invalid_request_error")


def test_unknown_model_and_path_are_404(alice):
    make_route()
    assert_error(call("/v1/messages", secret=alice.secret, body={**VALID, "model": "gpt-5"}), 404, "not_found_error")
    assert_error(call("/v1/complete", secret=alice.secret, body=VALID), 404, "not_found_error")


def test_wrong_method_is_405(alice):
    r = call("/v1/messages", secret=alice.secret, method="get")
    assert r.status == 405 and r.json()["error"]["type"] == "invalid_request_error"


def test_missing_or_bad_key_is_401(db):
    assert_error(call("/v1/messages", body=VALID), 401, "authentication_error")
    assert_error(call("/v1/messages", secret="syn_nope_nope", body=VALID), 401, "authentication_error")
    r = call("/v1/models", method="get", headers={"authorization": "Bearer garbage"})
    assert_error(r, 401, "authentication_error")


def test_body_over_the_limit_is_413(alice, monkeypatch):
    make_route()
    monkeypatch.setattr(exchange, "MAX_BODY_BYTES", 1000)
    body = {**VALID, "system": "x" * 2000}
    assert_error(call("/v1/messages", secret=alice.secret, body=body), 413, "request_too_large")


def test_full_queue_is_529_and_caller_over_its_share_is_429(alice, monkeypatch):
    make_route()
    monkeypatch.setattr(pool, "generation", pool.Admission(name="generation", limit=0, max_waiting=0, per_caller=8))
    assert_error(call("/v1/messages", secret=alice.secret, body=VALID), 529, "overloaded_error")
    monkeypatch.setattr(pool, "generation", pool.Admission(name="generation", limit=4, max_waiting=4, per_caller=0))
    r = call("/v1/messages", secret=alice.secret, body=VALID)
    assert_error(r, 429, "rate_limit_error")
    assert r.headers["retry-after"] == "1"
    monkeypatch.setattr(pool, "counting", pool.Admission(name="count_tokens", limit=0, max_waiting=0, per_caller=8))
    body = {k: v for k, v in VALID.items() if k != "max_tokens"}
    assert_error(call("/v1/messages/count_tokens", secret=alice.secret, body=body), 529, "overloaded_error")


def test_prompt_too_long_uses_anthropic_wording(alice):
    make_route(context_window=600, max_output=100)
    body = {**VALID, "max_tokens": 100, "messages": [{"role": "user", "content": "word " * 2000}]}
    error = assert_error(call("/v1/messages", secret=alice.secret, body=body), 400, "invalid_request_error")
    message = error["error"]["message"]
    assert message.startswith("prompt is too long: ") and message.endswith(" tokens > 500 maximum")
    assert int(message.split()[4]) > 500


def test_oversized_tool_result_is_fitted_not_refused(alice, qwen3_tokenizer):
    make_route(context_window=1200, max_output=200)
    huge = "\n".join(f"line {i}: " + "lorem ipsum " * 5 for i in range(400))
    body = {
        "model": "qwen3-test",
        "max_tokens": 200,
        "messages": [
            {"role": "user", "content": "read it"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": huge}]},
        ],
    }
    r = call("/v1/messages", secret=alice.secret, body=body)
    assert r.status == 200, r.body
    assert r.json()["usage"]["input_tokens"] <= 1000


# FUZZ
# ------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
FIELDS = [
    "model",
    "max_tokens",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "metadata",
]


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


VALID_PATHS = [p for p in _paths(VALID) if p]


@st.composite
def mutated_requests(draw):
    """A valid request with a few values replaced by arbitrary JSON, or removed."""
    body = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(VALID_PATHS))
        parent = body
        try:
            for key in path[:-1]:
                parent = parent[key]
            if draw(st.booleans()):
                parent[path[-1]] = draw(json_values)
            elif isinstance(parent, dict):
                parent.pop(path[-1], None)
        except (KeyError, IndexError, TypeError):
            continue
    if draw(st.booleans()):
        body[draw(st.sampled_from(FIELDS))] = draw(json_values)
    return body


STATUSES: list[int] = []


def _check(reply):
    STATUSES.append(reply.status)
    assert reply.status < 500, reply.body
    if reply.status >= 400:
        body = reply.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}


@pytest.fixture
def fuzz_env(alice):
    make_route()
    return alice


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=mutated_requests())
def test_fuzz_mutations_of_a_valid_request(fuzz_env, body):
    _check(call("/v1/messages", secret=fuzz_env.secret, body=body))
    _check(call("/v1/messages/count_tokens", secret=fuzz_env.secret, body=body))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=json_values | st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6))
def test_fuzz_random_json_bodies(fuzz_env, body):
    _check(call("/v1/messages", secret=fuzz_env.secret, body=body))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_fuzz_random_bytes(fuzz_env, raw):
    _check(call("/v1/messages", secret=fuzz_env.secret, raw=raw))


def test_zz_fuzz_reached_both_outcomes():
    # The mutation fuzz is only meaningful if some mutants are still valid and served.
    if STATUSES:
        assert 200 in STATUSES and any(400 <= s < 500 for s in STATUSES)


# STRICT INPUT
# ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda b: b["messages"][0].update(content="hi\x00"), "messages.0.content"),
        (lambda b: b["messages"][0].update(content="hi\ud800"), "messages.0.content"),
        (lambda b: b["messages"][1]["content"][0]["input"].update({"c\x00": 1}), "messages.1.content.0.input"),
        (lambda b: b.update(metadata={"user_id": "\udfff"}), "metadata.user_id"),
        (lambda b: b["tools"][0]["input_schema"].update(properties={"\ud83d": {}}), "tools.0.input_schema.properties"),
        (lambda b: b.update(max_tokens=16.0), "max_tokens"),
        (lambda b: b.update(top_k=5.0), "top_k"),
        (lambda b: b.update(thinking={"type": "enabled", "budget_tokens": 2048.0}), "thinking.budget_tokens"),
    ],
)
def test_nul_lone_surrogates_and_float_integers_are_400(alice, mutate, fragment):
    make_route()
    body = copy.deepcopy(VALID)
    mutate(body)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        if path.endswith("count_tokens") and fragment in ("max_tokens", "top_k"):
            continue  # count_tokens takes no sampling fields
        error = assert_error(call(path, secret=alice.secret, body=body), 400, "invalid_request_error")
        assert error["error"]["message"].startswith(fragment), error


def test_a_valid_surrogate_pair_is_text(alice):
    make_route()
    body = {**VALID, "messages": [{"role": "user", "content": "smile \ud83d\ude00"}]}
    assert call("/v1/messages", secret=alice.secret, body=body).status == 200


@pytest.mark.parametrize("raw", [b'{"model": 1e400}', b'{"max_tokens": ' + b"9" * 5000 + b"}", b"[" * 200 + b"]" * 200])
def test_unrepresentable_numbers_and_deep_nesting_are_400(alice, raw):
    make_route()
    assert_error(call("/v1/messages", secret=alice.secret, raw=raw), 400, "invalid_request_error")


def test_nul_in_a_header_or_the_query_is_400(alice):
    make_route()
    reply = call("/v1/messages", secret=alice.secret, body=VALID, headers={"x-claude-code-session-id": "a\x00"})
    assert "x-claude-code-session-id" in assert_error(reply, 400, "invalid_request_error")["error"]["message"].lower()
    reply = call("/v1/messages?beta=%00", secret=alice.secret, body=VALID)
    assert "'beta'" in assert_error(reply, 400, "invalid_request_error")["error"]["message"]
