"""What a sampling group gives the learner: each attempt's reward joined to the token
payloads of its captured model calls (published evidence only)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from apps.objects.selectors import object_get
from apps.objects.services import object_read, objects_read_many
from apps.proxy.capture import interaction_evidence
from apps.proxy.models import Eligibility, Integrity, Interaction
from apps.runs.models import SamplingGroup, TrialStatus
from apps.training.datums import Attempt, Call, GroupData
from apps.training.sampling import TRUNCATED, TRUNCATED_STOP


def _payload(interaction: Interaction) -> dict[str, Any]:
    """The interaction's token payload from the object store, publishing it first if the
    evidence publisher has not yet (training uses published evidence only)."""
    if interaction.integrity != Integrity.VERIFIED:
        # Publication reads the bytes back to verify them: those are the payload.
        _, data = interaction_evidence(interaction_id=interaction.id)
        if data is not None:
            return orjson.loads(data)
        interaction.refresh_from_db(fields=["integrity", "payload_sha256"])
    obj = object_get(org=interaction.org, sha256=interaction.payload_sha256)
    return orjson.loads(object_read(obj=obj))


# Payloads read at once: enough to keep the store's round trips overlapped, few enough that
# the raw bytes held besides the parsed payloads stay small (a call's payload holds its
# whole prompt: up to megabytes at long contexts).
READ_BATCH = 64


def _payloads(interactions: list[Interaction]) -> Iterator[dict[str, Any]]:
    """The token payloads of ``interactions``, in order, parsed one at a time as they are
    taken. The published ones are read together, READ_BATCH at a time (one statement for
    their references, the reads in parallel): a group's attempts make tens to hundreds of
    model calls each, and one round trip per call to the database and one to the object
    store, one after the other, put minutes on the learner's path with real attempts. Calls
    not published yet are published first, one by one, as before. Parsed by orjson: a
    payload holds the call's whole prompt as ids (tens of thousands of numbers), which it
    parses about three times faster than json, to the same values (floats included: both
    round-trip exactly)."""
    for start in range(0, len(interactions), READ_BATCH):
        batch = interactions[start : start + READ_BATCH]
        published = [i.payload_sha256 for i in batch if i.integrity == Integrity.VERIFIED]
        data = objects_read_many(org=batch[0].org, sha256s=published) if published else {}
        for interaction in batch:
            if interaction.integrity == Integrity.VERIFIED:
                yield orjson.loads(data[interaction.payload_sha256])
            else:
                yield _payload(interaction)


def group_attempts(*, group: SamplingGroup) -> list[Attempt]:
    """The group's attempts with their rewards and captured calls, packed in call order.
    With ``plan.exclude_truncated``, an attempt with a response cut at max_tokens is left
    out. An attempt already known to be unusable (it did not succeed, or a call of it
    cannot be trained on) is not read at all.

    Each payload is packed into its attempt's datums as it is read and then dropped: a
    call's payload holds its whole prompt, so holding every call of a group until the
    datums are built would take memory in the square of an attempt's length."""
    exclude_truncated = bool(group.run.spec.plan.get("exclude_truncated"))
    trials = list(group.trials.order_by("attempt"))
    calls: dict[str, list[Interaction]] = {t.id: [] for t in trials}
    for interaction in (
        # The attempt's own calls: a judge's calls assessed it and are not the policy's.
        Interaction.objects.filter(org_id=group.run.org_id, run_id=group.run_id, trial_id__in=list(calls), role="actor")
        .select_related("org")
        .order_by("created_at", "id")
    ):
        calls[interaction.trial_id].append(interaction)
    attempts: list[Attempt] = []
    trained: list[tuple[Attempt, Interaction]] = []  # the calls whose payloads are read
    for trial in trials:
        attempt = Attempt(trial_id=trial.id, reward=trial.reward, calls=())
        attempts.append(attempt)
        problem = "" if trial.status == TrialStatus.SUCCEEDED else f"attempt {trial.status}"
        for interaction in calls[trial.id]:
            if problem:
                break
            if exclude_truncated and interaction.stop_reason == TRUNCATED_STOP:
                problem = TRUNCATED
            elif interaction.eligibility != Eligibility.ELIGIBLE:
                problem = f"a model call is not trainable ({interaction.eligibility_reason or 'unsettled'})"
        if problem:
            attempt.exclude(problem)
        else:
            trained += [(attempt, interaction) for interaction in calls[trial.id]]
    for (attempt, _), payload in zip(trained, _payloads([i for _, i in trained]), strict=True):
        attempt.add(
            Call(
                prompt_ids=payload["prompt_ids"],
                output_ids=payload["output_ids"],
                logprobs=payload["logprobs"],
                agent=payload.get("agent_id") or "",
            )
        )
    return attempts


def group_summary(data: GroupData) -> dict[str, Any]:
    return {
        "group": data.group_id,
        "attempts": data.attempts,
        "qualified": len(data.qualified),
        "rewards": data.rewards,
        "datums": len(data.datums),
        "skipped": data.skipped or None,
        "problems": data.problems,
        "excluded": data.excluded,
    }
