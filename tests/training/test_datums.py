"""Qualification, group-centred advantages and datum packing (the cookbook's semantics)."""

from __future__ import annotations

import math

import pytest

from apps.training.datums import (
    Attempt,
    Call,
    attempt_datums,
    datums_to_tinker,
    group_advantages,
    group_prepare,
    trajectory_datums,
)


def test_prefix_extending_calls_share_one_datum():
    # The cookbook's own example: turn 2's prompt extends prompt 1 + sampled 1.
    calls = [
        Call(prompt_ids=[1, 2, 3], output_ids=[10, 11], logprobs=[-0.1, -0.2]),
        Call(prompt_ids=[1, 2, 3, 10, 11, 4, 5], output_ids=[12, 13, 14], logprobs=[-0.3, -0.4, -0.5]),
    ]
    (datum,) = trajectory_datums(trial_id="t", calls=calls, advantage=0.5)
    assert datum.input_ids == [1, 2, 3, 10, 11, 4, 5, 12, 13]
    assert datum.target_ids == [2, 3, 10, 11, 4, 5, 12, 13, 14]
    assert datum.advantages == [0, 0, 0.5, 0.5, 0, 0, 0.5, 0.5, 0.5]
    assert datum.mask == [0, 0, 1, 1, 0, 0, 1, 1, 1]
    assert datum.logprobs == [0, 0, -0.1, -0.2, 0, 0, -0.3, -0.4, -0.5]
    assert datum.sampled_tokens == 5


def test_a_broken_prefix_starts_a_new_datum_with_the_whole_prompt_as_context():
    calls = [
        Call(prompt_ids=[1, 2], output_ids=[3], logprobs=[-1.0]),
        Call(prompt_ids=[1, 2, 3, 4], output_ids=[5], logprobs=[-1.0]),
        Call(prompt_ids=[1, 2, 99], output_ids=[7], logprobs=[-2.0]),  # history rewritten
    ]
    first, second = trajectory_datums(trial_id="t", calls=calls, advantage=-1.0)
    assert first.input_ids == [1, 2, 3, 4] and first.target_ids == [2, 3, 4, 5]
    assert second.input_ids == [1, 2, 99] and second.target_ids == [2, 99, 7]
    assert second.advantages == [0, 0, -1.0]


def test_subagent_calls_are_their_own_trajectory_with_the_attempts_advantage():
    attempt = Attempt(
        trial_id="t",
        reward=1.0,
        calls=[
            Call(prompt_ids=[1], output_ids=[2], logprobs=[-0.5]),
            Call(prompt_ids=[50, 51], output_ids=[52], logprobs=[-0.5], agent="sub-1"),
            Call(prompt_ids=[1, 2, 3], output_ids=[4], logprobs=[-0.5]),
        ],
    )
    main, sub = attempt_datums(attempt=attempt, advantage=0.25)
    assert main.input_ids == [1, 2, 3] and main.target_ids == [2, 3, 4]
    assert sub.input_ids == [50, 51] and sub.advantages == [0, 0.25]


def test_advantages_are_centred_on_the_group_mean_without_scaling():
    assert group_advantages([1.0, 0.0, 0.5]) == [0.5, -0.5, 0.0]
    assert group_advantages([]) == []


def _attempt(trial: str, reward: float | None, **kw) -> Attempt:
    return Attempt(trial_id=trial, reward=reward, calls=[Call(prompt_ids=[1], output_ids=[2], logprobs=[-0.1], **kw)])


def test_group_prepare_qualifies_applies_eligibility_and_skips_zero_advantages():
    attempts = [
        _attempt("a", 1.0),
        _attempt("b", 0.0),
        _attempt("c", 0.5),  # advantage 0: no datum
        _attempt("d", None),  # no reward
        Attempt(trial_id="e", reward=1.0, calls=[Call(prompt_ids=[1], output_ids=[2, 3], logprobs=[-0.1])]),
        Attempt(trial_id="f", reward=1.0, calls=[Call(prompt_ids=[1], output_ids=[2], logprobs=[math.nan])]),
        Attempt(trial_id="g", reward=1.0, calls=[], problem="attempt failed"),
    ]
    data = group_prepare(group_id="g1", attempts=attempts, min_valid=2, require_variance=True)
    assert data.qualified == ["a", "b", "c"]
    assert data.advantages == {"a": 0.5, "b": -0.5, "c": 0.0}
    assert [d.trial_id for d in data.datums] == ["a", "b"]
    assert data.problems == {
        "no finite reward": 1,
        "logprobs do not align with the sampled tokens": 1,
        "logprobs not finite": 1,
        "attempt failed": 1,
    }
    assert not data.skipped


@pytest.mark.parametrize(
    ("rewards", "min_valid", "why"),
    [([1.0, 1.0, 1.0], 2, "same reward"), ([1.0], 2, "fewer than min_valid_per_group=2")],
)
def test_groups_without_a_learning_signal_are_skipped(rewards, min_valid, why):
    attempts = [_attempt(f"t{i}", r) for i, r in enumerate(rewards)]
    data = group_prepare(group_id="g", attempts=attempts, min_valid=min_valid, require_variance=True)
    assert why in data.skipped and data.datums == []


def test_constant_groups_pass_when_variance_is_not_required_but_give_no_datums():
    attempts = [_attempt("a", 1.0), _attempt("b", 1.0)]
    data = group_prepare(group_id="g", attempts=attempts, min_valid=2, require_variance=False)
    assert data.advantages == {"a": 0.0, "b": 0.0}
    assert data.datums == [] and "non-zero advantage" in data.skipped


def test_wire_datums_are_tinker_types_with_the_importance_sampling_inputs():
    (datum,) = trajectory_datums(
        trial_id="t", calls=[Call(prompt_ids=[5, 6], output_ids=[7, 8], logprobs=[-1.0, -2.0])], advantage=1.0
    )
    (wire,) = datums_to_tinker([datum])
    assert wire.model_input.to_ints() == [5, 6, 7]
    inputs = wire.loss_fn_inputs
    assert inputs["target_tokens"].tolist() == [6, 7, 8]
    assert inputs["logprobs"].tolist() == [0.0, -1.0, -2.0]
    assert inputs["advantages"].tolist() == [0.0, 1.0, 1.0]
    assert set(inputs) == {"target_tokens", "logprobs", "advantages"}  # no mask: Tinker refuses unknown keys
