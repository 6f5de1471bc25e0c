"""A run plan's `sampling` holds the attempts' model calls: the plan's temperature, top_p,
top_k replace the harness's, its max_tokens caps the request's, and with a seed each call
samples reproducibly (the same prompt in the same attempt gives the same tokens)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest

from apps.accounts.services import model_credential_issue
from apps.proxy import capture
from apps.proxy.calls import call_seed
from apps.proxy.models import Interaction
from apps.runs.plans import plan_normalize
from apps.trials.model_access import attempt_sampling
from tests.conftest import make_member
from tests.proxy.conftest import call, make_route

pytestmark = pytest.mark.django_db

TINY = {"family": "qwen3", "tiny": True, "seed": 0}


def held_secret(org, sampling: dict, *, trial: str = "trl_1") -> str:
    _, secret = model_credential_issue(
        org=org,
        run_id="run_1",
        trial_id=trial,
        route="qwen3-local",
        snapshot="",
        ttl=timedelta(hours=1),
        sampling=sampling,
    )
    return secret


def ask(secret: str, *, text: str = "count to ten", **extra) -> dict:
    """The staged payload of one call (prompt ids expanded)."""
    body = {"model": "qwen3-local", "max_tokens": 100, "messages": [{"role": "user", "content": text}], **extra}
    reply = call("/v1/messages", secret=secret, body=body)
    assert reply.status == 200, reply.body
    return capture.staged_payload(interaction=Interaction.objects.get(request_id=reply.headers["request-id"]))


def test_the_plan_replaces_the_harness_values_and_caps_max_tokens(qwen3_tokenizer):
    org = make_member("team", "alice").org
    make_route("qwen3-local", backend="local", config=TINY)
    secret = held_secret(org, {"temperature": 0.5, "top_k": 3, "max_tokens": 6, "seed": 42})
    row = ask(secret, temperature=1.0, top_k=40)
    sampling = row["sampling"]
    assert (sampling["temperature"], sampling["top_k"], sampling["max_tokens"]) == (0.5, 3, 6)
    assert sampling["held"] == ["max_tokens", "seed", "temperature", "top_k"]
    assert sampling["requested"] == {"max_tokens": 100, "temperature": 1.0, "top_k": 40}
    assert len(row["output_ids"]) <= 6  # the cap reached the sampler
    # The call's seed is drawn from the attempt's and the exact prompt, and the sampler used it.
    assert sampling["seed"] == call_seed(attempt_seed=42, prompt_ids=row["prompt_ids"])
    assert row["snapshot"]["sample_seed"] == sampling["seed"]


def test_a_held_seed_reproduces_an_attempt_and_attempts_differ(qwen3_tokenizer):
    org = make_member("team", "alice").org
    make_route("qwen3-local", backend="local", config=TINY)
    plan = {"temperature": 1.0, "max_tokens": 24}
    first = ask(held_secret(org, {**plan, "seed": 7}, trial="trl_a"))
    rerun = ask(held_secret(org, {**plan, "seed": 7}, trial="trl_b"))
    other = ask(held_secret(org, {**plan, "seed": 8}, trial="trl_c"))
    assert first["output_ids"] == rerun["output_ids"]
    assert first["logprobs"] == rerun["logprobs"]
    assert other["output_ids"] != first["output_ids"]
    # Another prompt in the same attempt draws another seed.
    assert (
        ask(held_secret(org, {**plan, "seed": 7}), text="name a colour")["sampling"]["seed"]
        != (first["sampling"]["seed"])
    )


def test_without_a_held_value_the_request_decides(qwen3_tokenizer):
    org = make_member("team", "alice").org
    make_route("qwen3-local", backend="local", config=TINY)
    sampling = ask(held_secret(org, {}), temperature=0.25, max_tokens=5)["sampling"]
    assert (sampling["temperature"], sampling["max_tokens"]) == (0.25, 5)
    assert "held" not in sampling and "requested" not in sampling


def test_attempt_seeds_follow_the_attempts_place_not_its_ids():
    def trial(step: int, position: int, attempt: int) -> SimpleNamespace:
        return SimpleNamespace(group=SimpleNamespace(step=step, position=position), attempt=attempt)

    plan = {"sampling": {"temperature": 0.7, "seed": 5}}
    seeds = {
        attempt_sampling(plan=plan, trial=trial(s, p, a))["seed"]  # type: ignore[arg-type]
        for s in range(3)
        for p in range(3)
        for a in range(4)
    }
    assert len(seeds) == 36  # no two attempts of a run share a seed
    again = attempt_sampling(plan=plan, trial=trial(1, 2, 3))  # type: ignore[arg-type]
    assert again == attempt_sampling(plan=plan, trial=trial(1, 2, 3))  # type: ignore[arg-type]
    assert again["temperature"] == 0.7
    assert attempt_sampling(plan={"sampling": {"seed": 6}}, trial=trial(1, 2, 3))["seed"] != again["seed"]  # type: ignore[arg-type]
    assert attempt_sampling(plan={"sampling": {"top_p": 0.9}}, trial=trial(0, 0, 0)) == {"top_p": 0.9}  # type: ignore[arg-type]
    assert attempt_sampling(plan={}, trial=trial(0, 0, 0)) == {}  # type: ignore[arg-type]


def test_a_pinned_plan_claims_no_sampling_it_was_not_given():
    assert "sampling" not in plan_normalize(kind="evaluate", plan={})
    assert plan_normalize(kind="train", plan={"steps": 1, "sampling": {"seed": 3}})["sampling"] == {"seed": 3}
