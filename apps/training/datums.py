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
from collections.abc import Iterable
from dataclasses import InitVar, dataclass, field
from typing import Any

import orjson


@dataclass(frozen=True)
class Call:
    """One captured model call of an attempt."""

    prompt_ids: list[int]
    output_ids: list[int]  # sampled ids, the stop token included when one was sampled
    logprobs: list[float]  # one per output id, under the distribution sampled from
    agent: str = ""  # "" for the main agent; a delegated agent's id otherwise


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


@dataclass
class _Segment:
    """One datum's tokens before its advantage is known: observation tokens (mask 0) and
    sampled ones (mask 1, with the sampler's logprobs)."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[float] = field(default_factory=list)


class Trajectory:
    """One agent's calls, packed into datum segments as they are added.

    A call whose prompt extends the open segment (previous prompt + sampled tokens) appends
    only its new observation tokens; a broken prefix (history rewritten, compaction) opens
    a new segment with the whole prompt as context. The calls themselves are not kept: an
    attempt of n calls at long contexts holds its datums' tokens once, not every call's
    whole prompt (which together grow with n squared: 100 calls at 100K tokens are 5M ids
    per attempt, tens of millions per group). Advantages are applied when the datums are
    built, once the group's rewards have qualified."""

    def __init__(self) -> None:
        self.segments: list[_Segment] = []

    def add(self, call: Call) -> None:
        prompt = call.prompt_ids
        segment = self.segments[-1] if self.segments else None
        if (
            segment is not None
            and len(prompt) >= len(segment.tokens)
            and prompt[: len(segment.tokens)] == segment.tokens
        ):
            observation = prompt[len(segment.tokens) :]
        else:
            segment = _Segment()
            self.segments.append(segment)
            observation = prompt
        segment.tokens += observation
        segment.logprobs += [0.0] * len(observation)
        segment.mask += [0.0] * len(observation)
        segment.tokens += call.output_ids
        segment.logprobs += [float(v) for v in call.logprobs]
        segment.mask += [1.0] * len(call.output_ids)

    def datums(self, *, trial_id: str, advantage: float) -> list[PackedDatum]:
        """Each segment with something sampled as a right-shifted datum: sampled tokens
        carry ``advantage``, observation tokens 0."""
        return [
            PackedDatum(
                trial_id=trial_id,
                input_ids=s.tokens[:-1],
                target_ids=s.tokens[1:],
                logprobs=s.logprobs[1:],
                advantages=[advantage if m else 0.0 for m in s.mask[1:]],
                mask=s.mask[1:],
            )
            for s in self.segments
            if len(s.tokens) >= 2 and any(s.mask)
        ]


@dataclass
class Attempt:
    """An assessed attempt: its reward and its calls, packed per agent as they are added
    (``calls`` given here first, in order; the calls themselves are not kept)."""

    trial_id: str
    reward: float | None
    calls: InitVar[Iterable[Call]]  # no default: a default would be readable as Attempt.calls
    problem: str = ""  # why it cannot be used, if it cannot ("" = usable so far)
    trajectories: dict[str, Trajectory] = field(default_factory=dict, init=False)  # by agent, first call first
    call_count: int = field(default=0, init=False)

    def __post_init__(self, calls: Iterable[Call]) -> None:
        for call in calls:
            self.add(call)

    def add(self, call: Call) -> None:
        """Pack the attempt's next call, or record why the attempt cannot be trained on; once
        it cannot, later calls are not kept."""
        if self.problem:
            return
        problem = call_problem(call)
        if problem:
            self.exclude(problem)
            return
        self.trajectories.setdefault(call.agent, Trajectory()).add(call)
        self.call_count += 1

    def exclude(self, problem: str) -> None:
        self.problem = problem
        self.trajectories.clear()  # never trained on: do not hold its tokens


def attempt_qualify(attempt: Attempt) -> str:
    """Why an attempt cannot be used ("" if it can). A call's own problem was recorded when
    it was added."""
    if attempt.problem:
        return attempt.problem
    if attempt.reward is None or not math.isfinite(attempt.reward):
        return "no finite reward"
    return ""


def group_advantages(rewards: list[float]) -> list[float]:
    """Group-centred advantages: each reward minus the group's mean."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    return [r - mean for r in rewards]


def trajectory_datums(*, trial_id: str, calls: Iterable[Call], advantage: float) -> list[PackedDatum]:
    """Pack one agent's calls into datums (prefix-extending calls share a datum)."""
    trajectory = Trajectory()
    for call in calls:
        trajectory.add(call)
    return trajectory.datums(trial_id=trial_id, advantage=advantage)


def attempt_datums(*, attempt: Attempt, advantage: float) -> list[PackedDatum]:
    """Every agent of the attempt (main first, then subagents by first call) as datums,
    all carrying the attempt's advantage."""
    out: list[PackedDatum] = []
    # Main agent first; subagents in order of their first call (the sort is stable).
    for agent in sorted(attempt.trajectories, key=lambda a: a != ""):
        out.extend(attempt.trajectories[agent].datums(trial_id=attempt.trial_id, advantage=advantage))
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


# Packed datums as stored for the trainer: a JSON list of the datums' fields. JSON because
# orjson writes and reads it in well under a millisecond per thousand tokens and its floats
# round-trip exactly, so the trainer gets the very logprobs and advantages it would have
# built from the evidence.
DATUMS_CONTENT_TYPE = "application/json"


def datums_pack(datums: list[PackedDatum]) -> bytes:
    """The datums as bytes, for the object store (``datums_unpack`` reads them back equal)."""
    return orjson.dumps(
        [
            {
                "trial_id": d.trial_id,
                "input_ids": d.input_ids,
                "target_ids": d.target_ids,
                "logprobs": d.logprobs,
                "advantages": d.advantages,
                "mask": d.mask,
            }
            for d in datums
        ]
    )


def datums_unpack(data: bytes) -> list[PackedDatum]:
    return [PackedDatum(**fields) for fields in orjson.loads(data)]


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
