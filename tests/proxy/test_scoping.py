"""Who may call which route: per-attempt credentials, operator tokens, delegated agents."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.models import ModelCredential, Role
from apps.accounts.services import model_credential_revoke, worker_get_or_create, worker_token_issue
from apps.proxy.models import Interaction
from apps.proxy.selectors import route_resolve
from tests.conftest import make_member
from tests.proxy.conftest import assert_error, call, issue, make_route

pytestmark = pytest.mark.django_db


def body(model: str) -> dict:
    return {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def alice():
    return make_member("team", "alice")


@pytest.fixture
def routes():
    make_route("qwen3-attempt")
    make_route("qwen3-other", aliases=["other-alias"])


def served_route(reply) -> str:
    assert reply.status == 200, reply.body
    return Interaction.objects.get(request_id=reply.headers["request-id"]).route.name


def test_credential_serves_its_route_whatever_claude_name(alice, routes):
    secret = issue(alice.org, "qwen3-attempt")
    for model in ["qwen3-attempt", "claude-haiku-4-5-20251001", "sonnet", "opus", "anything-unknown"]:
        r = call("/v1/messages", secret=secret, body=body(model))
        assert served_route(r) == "qwen3-attempt", model
    # count_tokens and models follow the same binding
    assert call("/v1/messages/count_tokens", secret=secret, body=body("haiku")).status == 200
    listed = call("/v1/models", secret=secret, method="get").json()["data"]
    assert [m["id"] for m in listed] == ["qwen3-attempt"]


def test_credential_naming_another_route_is_403(alice, routes):
    secret = issue(alice.org, "qwen3-attempt")
    error = assert_error(call("/v1/messages", secret=secret, body=body("qwen3-other")), 403, "permission_error")
    assert "qwen3-attempt" in error["error"]["message"]
    assert_error(call("/v1/messages/count_tokens", secret=secret, body=body("qwen3-other")), 403, "permission_error")
    assert not Interaction.objects.exists()


def test_delegated_agent_inherits_the_attempt_route(alice, routes):
    secret = issue(alice.org, "qwen3-attempt", trial="trl_a", run="run_a")
    headers = {
        "x-claude-code-session-id": "sess-1",
        "x-claude-code-agent-id": "agent-7",
        "x-claude-code-parent-agent-id": "agent-1",
        "x-synth-trial": "trl_a",
    }
    r = call("/v1/messages", secret=secret, body=body("claude-haiku-4-5"), headers=headers)
    assert served_route(r) == "qwen3-attempt"
    interaction = Interaction.objects.get()
    assert (interaction.run_id, interaction.trial_id) == ("run_a", "trl_a")
    assert (interaction.session_id, interaction.agent_id, interaction.parent_agent_id) == (
        "sess-1",
        "agent-7",
        "agent-1",
    )
    assert interaction.correlation_id == "trl_a" and interaction.model_requested == "claude-haiku-4-5"
    # ... and cannot escape it either
    r = call("/v1/messages", secret=secret, body=body("qwen3-other"), headers=headers)
    assert_error(r, 403, "permission_error")


def test_expired_and_revoked_credentials_are_401(alice, routes):
    secret = issue(alice.org, "qwen3-attempt")
    assert call("/v1/messages", secret=secret, body=body("sonnet")).status == 200
    cred = ModelCredential.objects.get()
    ModelCredential.objects.filter(pk=cred.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    error = assert_error(call("/v1/messages", secret=secret, body=body("sonnet")), 401, "authentication_error")
    assert "expired" in error["error"]["message"]

    secret2 = issue(alice.org, "qwen3-attempt")
    model_credential_revoke(cred=ModelCredential.objects.exclude(pk=cred.pk).get())
    error = assert_error(call("/v1/messages", secret=secret2, body=body("sonnet")), 401, "authentication_error")
    assert "revoked" in error["error"]["message"]
    # a tampered secret with a real prefix
    assert_error(call("/v1/messages", secret=secret2[:-2] + "xx", body=body("sonnet")), 401, "authentication_error")


def test_credential_of_a_disabled_route_is_404(alice):
    make_route("qwen3-attempt", inference_enabled=False)
    secret = issue(alice.org, "qwen3-attempt")
    assert_error(call("/v1/messages", secret=secret, body=body("qwen3-attempt")), 404, "not_found_error")


def test_operator_token_resolves_names_and_aliases(alice, routes):
    assert served_route(call("/v1/messages", secret=alice.secret, body=body("qwen3-other"))) == "qwen3-other"
    assert served_route(call("/v1/messages", secret=alice.secret, body=body("other-alias"))) == "qwen3-other"
    # "claude-*" is an alias of both routes: deterministic (the first by name)
    assert served_route(call("/v1/messages", secret=alice.secret, body=body("claude-opus-4-1"))) == "qwen3-attempt"
    interaction = Interaction.objects.filter(model_requested="claude-opus-4-1").get()
    assert interaction.principal_kind == "operator" and interaction.trial_id == ""
    assert_error(call("/v1/messages", secret=alice.secret, body=body("gpt-4o")), 404, "not_found_error")
    # Authorization: Bearer works the same as x-api-key
    r = call("/v1/messages", body=body("qwen3-other"), headers={"authorization": f"Bearer {alice.secret}"})
    assert r.status == 200


def test_viewers_and_workers_may_not_call_models(alice, routes):
    vera = make_member("team", "vera", Role.VIEWER)
    assert_error(call("/v1/messages", secret=vera.secret, body=body("qwen3-other")), 403, "permission_error")
    worker_secret = worker_token_issue(worker=worker_get_or_create(name="w1")).secret
    assert_error(call("/v1/messages", secret=worker_secret, body=body("qwen3-other")), 403, "permission_error")


def test_alias_resolution_order():
    make_route("zeta", aliases=["claude-*"])
    make_route("alpha", aliases=["claude-3-5-haiku*", "Sonnet"])
    assert route_resolve(name="zeta").name == "zeta"
    assert route_resolve(name="sonnet").name == "alpha"  # exact alias, case-insensitive
    assert route_resolve(name="claude-3-5-haiku-20241022").name == "alpha"  # the most specific glob
    assert route_resolve(name="claude-sonnet-4").name == "zeta"
    assert route_resolve(name="nothing") is None


def test_credentials_are_per_org(alice, routes):
    bob = make_member("rival", "bob")
    secret = issue(bob.org, "qwen3-attempt")
    call("/v1/messages", secret=secret, body=body("sonnet"))
    assert Interaction.objects.get().org_id == bob.org.id
