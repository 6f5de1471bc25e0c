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


def _packed(attempt) -> list[tuple[str, list[int], list[float]]]:
    """The attempt's packed calls: each test call is its own agent's, so its own segment."""
    return [(agent, s.tokens, s.logprobs) for agent, t in attempt.trajectories.items() for s in t.segments]


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
            assert _packed(attempt) == [
                (f"agent-{n}", [index, n, 1, 2, 900 + n], [0.0, 0.0, 0.0, 0.0, -0.5 - n]) for n in range(calls)
            ]
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
    assert [tokens[1] for _, tokens, _ in _packed(attempts[first.id])] == [0, 1, 2]
    published.refresh_from_db()
    assert published.integrity == Integrity.VERIFIED
    # An attempt with a call that is not trainable is excluded with the reason, and none of
    # its payloads is held.
    assert "not trainable (fitted)" in attempts[second.id].problem
    assert attempts[second.id].trajectories == {}
    assert attempts[third.id].problem == "" and [t[1][1] for t in _packed(attempts[third.id])] == [0, 1]


def test_a_long_attempt_is_held_as_its_datum_not_as_every_calls_prompt(alice, monkeypatch):
    """Each call's prompt extends the previous call's: the group's payloads together hold
    about (calls / 2) times the ids of the packed datum. Reading the group holds the datums
    and one batch of raw payloads, far below what keeping every call's payload would take
    (Python's own allocations, counted by tracemalloc: no timing involved)."""
    import random
    import tracemalloc

    import orjson

    from apps.objects.services import objects_read_many
    from apps.training import evidence

    # Raw payloads held per batch: fewer than the 120 calls, so the packing is what is measured.
    monkeypatch.setattr(evidence, "READ_BATCH", 16)
    group = _group(alice, calls=0)
    rng = random.Random(3)
    trials = list(group.trials.select_related("run__org").order_by("attempt"))
    stored = []
    for trial in trials:
        prompt = [rng.randrange(1000, 150_000) for _ in range(500)]
        for _ in range(40):
            output = [rng.randrange(1000, 150_000) for _ in range(30)]
            payload = {"prompt_ids": prompt, "output_ids": output, "logprobs": [-0.25] * 30}
            stored.append(call_stored(trial=trial, payload=payload, integrity=Integrity.VERIFIED))
            prompt = prompt + output + [rng.randrange(1000, 150_000) for _ in range(120)]

    tracemalloc.start()
    try:
        data = objects_read_many(org=alice.org, sha256s=[i.payload_sha256 for i in stored])
        held = [orjson.loads(data[i.payload_sha256]) for i in stored]
        every_call, _ = tracemalloc.get_traced_memory()
        del data, held
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        attempts = group_attempts(group=group)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Packed: one datum per attempt, every call's sampled tokens in it.
    for attempt in attempts:
        (trajectory,) = attempt.trajectories.values()
        (segment,) = trajectory.segments
        assert len(segment.tokens) == 500 + 40 * 30 + 39 * 120 and sum(segment.mask) == 40 * 30
    assert peak - base < every_call / 3, (peak - base, every_call)
