"""Judge agreement: how far two assessments of the same retained outputs agree.

Two runs assess the same work when both are regrades of one source run, or one is a
regrade of the other (then the other's trials are the original verifier's assessments).
Trials are matched by the attempt they assess: a regrade trial's source, an original
trial itself. Each assessment is reduced to pass/fail (reward >= the threshold, the same
criterion as pass@k by default), and the pairs give the agreement rate, Cohen's kappa
(agreement corrected for what two raters with these pass rates would reach by chance) and
the confusion matrix. Attempts that either side could not assess (no reward: a verifier or
platform error, a lost trial) are counted apart and weigh in no figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apps.accounts.models import Organization
from apps.core.errors import ValidationFailed
from apps.runs import selectors
from apps.runs.evaluation import PASS_THRESHOLD
from apps.runs.models import Run, RunKind, Trial


@dataclass(frozen=True)
class Confusion:
    """Pairs of verdicts, A's first: pass_fail is A passed and B failed."""

    pass_pass: int = 0
    pass_fail: int = 0
    fail_pass: int = 0
    fail_fail: int = 0

    @property
    def total(self) -> int:
        return self.pass_pass + self.pass_fail + self.fail_pass + self.fail_fail


def confusion_count(*, pairs: list[tuple[bool, bool]]) -> Confusion:
    counts = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    for pair in pairs:
        counts[pair] += 1
    return Confusion(
        pass_pass=counts[(True, True)],
        pass_fail=counts[(True, False)],
        fail_pass=counts[(False, True)],
        fail_fail=counts[(False, False)],
    )


def agreement_rate(*, confusion: Confusion) -> float | None:
    n = confusion.total
    return (confusion.pass_pass + confusion.fail_fail) / n if n else None


def cohen_kappa(*, confusion: Confusion) -> float | None:
    """(p_o - p_e) / (1 - p_e). None when p_e is 1 (both sides gave one verdict to every
    attempt): chance alone explains all agreement and kappa is undefined."""
    n = confusion.total
    if not n:
        return None
    observed = (confusion.pass_pass + confusion.fail_fail) / n
    a_pass = (confusion.pass_pass + confusion.pass_fail) / n
    b_pass = (confusion.pass_pass + confusion.fail_pass) / n
    expected = a_pass * b_pass + (1 - a_pass) * (1 - b_pass)
    if expected >= 1.0:
        return None
    return (observed - expected) / (1 - expected)


def _source_run_id(run: Run) -> str:
    if run.kind == RunKind.REGRADE:
        return str(run.spec.plan["source_run"])
    return run.id


def _assessed_work(run: Run) -> dict[str, Trial]:
    """The run's trials by the attempt whose outputs they assess."""
    trials = Trial.objects.filter(run=run).select_related("task_version").order_by("id")
    return {(t.source_id or t.id): t for t in trials}


def _side(trial: Trial, *, threshold: float) -> dict[str, Any]:
    return {
        "trial": trial.id,
        "reward": trial.reward,
        "passed": trial.reward >= threshold if trial.reward is not None else None,
    }


def run_agreement(*, org: Organization, run_id: str, other_id: str, threshold: float | None = None) -> dict[str, Any]:
    """Agreement of run ``run_id`` (A) with run ``other_id`` (B) on the attempts both assessed."""
    a = selectors.run_get(org=org, run_id=run_id)
    b = selectors.run_get(org=org, run_id=other_id)
    if a.id == b.id:
        raise ValidationFailed("compare two different runs", field="with")
    if RunKind.REGRADE not in (a.kind, b.kind):
        raise ValidationFailed(
            "agreement compares a regrade with its source run or with another regrade of it", field="with"
        )
    source_a, source_b = _source_run_id(a), _source_run_id(b)
    if source_a != source_b:
        raise ValidationFailed(
            f"{a.id} assesses the outputs of {source_a} and {b.id} those of {source_b}: not the same work",
            field="with",
        )
    cutoff = PASS_THRESHOLD if threshold is None else threshold
    work_a, work_b = _assessed_work(a), _assessed_work(b)
    pairs: list[tuple[bool, bool]] = []
    disagreements = []
    unassessed = 0
    for key in sorted(work_a.keys() & work_b.keys()):
        trial_a, trial_b = work_a[key], work_b[key]
        if trial_a.reward is None or trial_b.reward is None:
            unassessed += 1
            continue
        verdicts = (trial_a.reward >= cutoff, trial_b.reward >= cutoff)
        pairs.append(verdicts)
        if verdicts[0] != verdicts[1]:
            disagreements.append(
                {
                    "attempt": key,
                    "task": trial_a.task_version.name,
                    "a": _side(trial_a, threshold=cutoff),
                    "b": _side(trial_b, threshold=cutoff),
                }
            )
    confusion = confusion_count(pairs=pairs)
    return {
        "a": a.id,
        "b": b.id,
        "source_run": source_a,
        "threshold": cutoff,
        "compared": confusion.total,
        "unassessed": unassessed,
        "only_in_a": len(work_a.keys() - work_b.keys()),
        "only_in_b": len(work_b.keys() - work_a.keys()),
        "agreement": agreement_rate(confusion=confusion),
        "kappa": cohen_kappa(confusion=confusion),
        "confusion": {
            "pass_pass": confusion.pass_pass,
            "pass_fail": confusion.pass_fail,
            "fail_pass": confusion.fail_pass,
            "fail_fail": confusion.fail_fail,
        },
        "disagreements": disagreements,
    }
