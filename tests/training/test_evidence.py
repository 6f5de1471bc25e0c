"""What a settled group gives the learner (apps.training.evidence.group_attempts): each
attempt's calls in order with their published payloads, read together however many calls
the attempts made."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.proxy.models import Eligibility, Integrity, Interaction
from apps.runs.models import SamplingGroup, Trial
from apps.training.evidence import group_attempts
from apps.training.services import training_start
from tests.factories import make_dataset_version
from tests.training.learner_steps import call_stored, submit_train

pytestmark = pytest.mark.django_db


def _call(
    *, trial: Trial, number: int, integrity: str = Integrity.VERIFIED, eligibility: str = Eligibility.ELIGIBLE
) -> Interaction:
    """A settled model call of ``trial`` whose payload says which call it is."""
    payload = {
        "prompt_ids": [trial.attempt, number, 1, 2],
        "output_ids": [900 + number],
        "logprobs": [-0.5 - number],
        "agent_id": f"agent-{number}",
    }
    reason = "" if eligibility == Eligibility.ELIGIBLE else "fitted"
    return call_stored(
        trial=trial, payload=payload, integrity=integrity, eligibility=eligibility, eligibility_reason=reason
    )


def _group(member, *, calls: int) -> SamplingGroup:
    dataset = make_dataset_version(org=member.org, name=f"ev{calls}", tasks=1)
    plan = {"steps": 1, "batch_size": 1, "group_size": 3, "learning_rate": 0.05, "lora_rank": 2}
    run = submit_train(org=member.org, dataset=dataset, model={"route": "qwen3-8b"}, plan=plan, key=f"ev{calls}")
    training_start(run_id=run.id)
    group = SamplingGroup.objects.select_related("run__spec").get(run=run, step=0)
    for trial in group.trials.select_related("run__org").order_by("attempt"):
        for number in range(calls):
            _call(trial=trial, number=number)
    Trial.objects.filter(group=group).update(status="succeeded", reward=0.5)
    return group


def test_every_call_in_order_with_its_payload_in_statements_that_do_not_grow_with_calls(alice):
    counts = {}
    for calls in (2, 7):
        group = _group(alice, calls=calls)
        with CaptureQueriesContext(connection) as queries:
            attempts = group_attempts(group=group)
        counts[calls] = len(queries.captured_queries)
        assert [a.problem for a in attempts] == ["", "", ""]
        for attempt in attempts:
            index = Trial.objects.get(pk=attempt.trial_id).attempt
            assert [c.prompt_ids for c in attempt.calls] == [[index, n, 1, 2] for n in range(calls)]
            assert [c.output_ids for c in attempt.calls] == [[900 + n] for n in range(calls)]
            assert [c.logprobs for c in attempt.calls] == [[-0.5 - n] for n in range(calls)]
            assert [c.agent for c in attempt.calls] == [f"agent-{n}" for n in range(calls)]
    # 6 calls more per attempt, 15 more payloads: not one statement more.
    assert counts[7] == counts[2]


@pytest.mark.parametrize("batch", [64, 2])
def test_calls_not_yet_verified_are_verified_and_a_call_not_trainable_ends_its_attempt(alice, batch, monkeypatch):
    from apps.training import evidence

    monkeypatch.setattr(evidence, "READ_BATCH", batch)  # 2: reads in batches across attempts
    group = _group(alice, calls=2)
    first, second, third = group.trials.select_related("run__org").order_by("attempt")
    published = _call(trial=first, number=2, integrity=Integrity.PUBLISHED)
    _call(trial=second, number=2, eligibility=Eligibility.INELIGIBLE)
    attempts = {a.trial_id: a for a in group_attempts(group=group)}
    # The call published but not verified was read back, verified, and counts.
    assert [c.prompt_ids[1] for c in attempts[first.id].calls] == [0, 1, 2]
    published.refresh_from_db()
    assert published.integrity == Integrity.VERIFIED
    # An attempt with a call that is not trainable is excluded with the reason (the calls
    # before it read, as they always were).
    assert "not trainable (fitted)" in attempts[second.id].problem
    assert [c.prompt_ids[1] for c in attempts[second.id].calls] == [0, 1]
    assert attempts[third.id].problem == "" and len(attempts[third.id].calls) == 2
