"""From assessed attempts to training data: qualification, group-centred advantages, datums.

Pure functions over plain values (no database, no backend), so the rules are easy to read
and to test. They follow the semantics of the Tinker cookbook's RL data processing
(``rl/data_processing.py``: ``compute_advantages`` and ``trajectory_to_data``) so that a
run trained here and one trained by the cookbook see the same gradients:

* advantage = reward - mean(rewards of the group's qualified attempts); no std scaling;
* one attempt's model calls, in order, form a trajectory per agent (the main agent, and
  each delegated subagent separately); a call whose prompt extends everything before it
  (previous prompt + sampled tokens) only appends its new observation tokens, so
  prefix-extending calls share ONE datum;
* observation tokens get advantage 0 (no gradient); sampled tokens get the attempt's
  advantage and the sampler's logprobs; a subagent's calls share its attempt's advantage;
* when the prefix breaks (the harness rewrote history, compaction, a fresh subagent),
  the current datum ends and a new one starts with the whole new prompt as context;
* each datum is right-shifted: input = tokens[:-1], targets = tokens[1:], and every
  per-token array is sliced the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Call:
    """One captured model call of an attempt."""

    prompt_ids: list[int]
    output_ids: list[int]  # sampled ids, the stop token included when one was sampled
    logprobs: list[float]  # one per output id, under the distribution sampled from
    agent: str = ""  # "" for the main agent; a delegated agent's id otherwise


@dataclass
class Attempt:
    """An assessed attempt with its calls (in the order they were made)."""

    trial_id: str
    reward: float | None
    calls: list[Call]
    problem: str = ""  # why it cannot be used, if it cannot ("" = usable so far)


@dataclass
class PackedDatum:
    """A training example in the wire shape both backends take (tinker.types.Datum fields)."""

    trial_id: str
    input_ids: list[int]
    target_ids: list[int]
    logprobs: list[float]
    advantages: list[float]
    mask: list[float]  # 1.0 where the token was sampled (for metrics; not sent)

    @property
    def sampled_tokens(self) -> int:
        return int(sum(self.mask))


@dataclass
class GroupData:
    """What one sampling group contributes, or why it contributes nothing."""

    group_id: str
    attempts: int
    qualified: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    advantages: dict[str, float] = field(default_factory=dict)
    datums: list[PackedDatum] = field(default_factory=list)
    skipped: str = ""  # reason the group gives no data
    problems: dict[str, int] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)  # trial id -> why it is left out


def call_problem(call: Call) -> str:
    """Why a call cannot be trained on ("" if it can): tokens and logprobs must align and
    be finite, and something must have been sampled."""
    if not call.prompt_ids:
        return "empty prompt"
    if not call.output_ids:
        return "nothing sampled"
    if len(call.logprobs) != len(call.output_ids):
        return "logprobs do not align with the sampled tokens"
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in call.logprobs):
        return "logprobs not finite"
    return ""


def attempt_qualify(attempt: Attempt) -> str:
    """Why an attempt cannot be used ("" if it can)."""
    if attempt.problem:
        return attempt.problem
    if attempt.reward is None or not math.isfinite(attempt.reward):
        return "no finite reward"
    for call in attempt.calls:
        problem = call_problem(call)
        if problem:
            return problem
    return ""


def group_advantages(rewards: list[float]) -> list[float]:
    """Group-centred advantages: each reward minus the group's mean."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    return [r - mean for r in rewards]


def trajectory_datums(*, trial_id: str, calls: list[Call], advantage: float) -> list[PackedDatum]:
    """Pack one agent's calls into datums (prefix-extending calls share a datum)."""
    datums: list[PackedDatum] = []
    tokens: list[int] = []
    logprobs: list[float] = []
    advantages: list[float] = []
    mask: list[float] = []

    def flush() -> None:
        if len(tokens) >= 2 and any(mask):
            datums.append(
                PackedDatum(
                    trial_id=trial_id,
                    input_ids=tokens[:-1],
                    target_ids=tokens[1:],
                    logprobs=logprobs[1:],
                    advantages=advantages[1:],
                    mask=mask[1:],
                )
            )

    for call in calls:
        prompt = call.prompt_ids
        if tokens and len(prompt) >= len(tokens) and prompt[: len(tokens)] == tokens:
            observation = prompt[len(tokens) :]
        else:
            flush()
            tokens, logprobs, advantages, mask = [], [], [], []
            observation = prompt
        tokens.extend(observation)
        logprobs.extend([0.0] * len(observation))
        advantages.extend([0.0] * len(observation))
        mask.extend([0.0] * len(observation))
        tokens.extend(call.output_ids)
        logprobs.extend(float(v) for v in call.logprobs)
        advantages.extend([advantage] * len(call.output_ids))
        mask.extend([1.0] * len(call.output_ids))
    flush()
    return datums


def attempt_datums(*, attempt: Attempt, advantage: float) -> list[PackedDatum]:
    """Every agent of the attempt (main first, then subagents by first call) as datums,
    all carrying the attempt's advantage."""
    by_agent: dict[str, list[Call]] = {}
    for call in attempt.calls:
        by_agent.setdefault(call.agent, []).append(call)
    out: list[PackedDatum] = []
    # Main agent first; subagents in order of their first call (the sort is stable).
    for agent in sorted(by_agent, key=lambda a: a != ""):
        out.extend(trajectory_datums(trial_id=attempt.trial_id, calls=by_agent[agent], advantage=advantage))
    return out


def group_prepare(*, group_id: str, attempts: list[Attempt], min_valid: int, require_variance: bool) -> GroupData:
    """Qualify a group's attempts, apply the plan's eligibility, compute advantages, pack."""
    data = GroupData(group_id=group_id, attempts=len(attempts))
    usable: list[Attempt] = []
    for attempt in attempts:
        problem = attempt_qualify(attempt)
        if problem:
            data.problems[problem] = data.problems.get(problem, 0) + 1
            data.excluded[attempt.trial_id] = problem
        else:
            usable.append(attempt)
    data.qualified = [a.trial_id for a in usable]
    data.rewards = [float(a.reward) for a in usable]  # type: ignore[arg-type]
    if len(usable) < min_valid:
        data.skipped = f"{len(usable)} qualified attempts, fewer than min_valid_per_group={min_valid}"
        return data
    if require_variance and len(set(data.rewards)) < 2:
        data.skipped = "every qualified attempt has the same reward (no learning signal)"
        return data
    for attempt, advantage in zip(usable, group_advantages(data.rewards), strict=True):
        data.advantages[attempt.trial_id] = advantage
        if advantage != 0.0:  # a zero advantage gives no gradient: do not spend compute on it
            data.datums.extend(attempt_datums(attempt=attempt, advantage=advantage))
    if not data.datums:
        data.skipped = "no attempt with a non-zero advantage made a model call"
    return data


def datums_to_tinker(datums: list[PackedDatum]) -> list[Any]:
    """tinker.types.Datum objects for ``forward_backward(..., "importance_sampling")``."""
    from tinker import types

    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(d.input_ids),
            loss_fn_inputs={
                "target_tokens": types.TensorData(data=d.target_ids, dtype="int64", shape=[len(d.target_ids)]),
                "logprobs": types.TensorData(data=d.logprobs, dtype="float32", shape=[len(d.logprobs)]),
                "advantages": types.TensorData(data=d.advantages, dtype="float32", shape=[len(d.advantages)]),
            },
        )
        for d in datums
    ]
