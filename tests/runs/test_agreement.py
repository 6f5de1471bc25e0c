"""Judge agreement: Cohen's kappa and the confusion matrix, and the API that matches two
assessments of the same retained outputs."""

from __future__ import annotations

import pytest

from apps.runs.agreement import Confusion, agreement_rate, cohen_kappa, confusion_count
from tests.factories import make_assessed_runs, make_dataset_version, make_profile_version


def test_kappa_of_a_hand_computed_table():
    # 50 items: both pass 20, A only 5, B only 10, both fail 15.
    # p_o = 35/50 = 0.7; A passes 0.5, B 0.6; p_e = 0.5*0.6 + 0.5*0.4 = 0.5; kappa = 0.2/0.5.
    confusion = Confusion(pass_pass=20, pass_fail=5, fail_pass=10, fail_fail=15)
    assert agreement_rate(confusion=confusion) == pytest.approx(0.7)
    assert cohen_kappa(confusion=confusion) == pytest.approx(0.4)


def test_kappa_is_one_for_perfect_agreement_and_negative_below_chance():
    assert cohen_kappa(confusion=Confusion(pass_pass=3, fail_fail=2)) == pytest.approx(1.0)
    # Always opposite verdicts with balanced rates: p_o = 0, p_e = 0.5.
    assert cohen_kappa(confusion=Confusion(pass_fail=2, fail_pass=2)) == pytest.approx(-1.0)


def test_kappa_is_undefined_when_chance_explains_everything_or_nothing_was_compared():
    assert cohen_kappa(confusion=Confusion(pass_pass=4)) is None  # both passed everything
    assert cohen_kappa(confusion=Confusion()) is None and agreement_rate(confusion=Confusion()) is None


def test_confusion_counts_pairs_a_first():
    pairs = [(True, True), (True, False), (False, True), (False, True), (False, False)]
    assert confusion_count(pairs=pairs) == Confusion(pass_pass=1, pass_fail=1, fail_pass=2, fail_fail=1)


@pytest.fixture
def assessed(alice):
    # The original verifier, then two judges, on the same 4 retained attempts (2 tasks x 2).
    source, (first, second) = make_assessed_runs(
        org=alice.org, original=[1.0, 1.0, 0.0, 0.0], regrades=[[1.0, 0.0, 0.0, None], [1.0, 1.0, 1.0, 0.5]]
    )
    return source, first, second


@pytest.mark.django_db
def test_a_regrade_against_the_original_verifier(alice, assessed):
    source, first, _ = assessed
    resp = alice.client.get(f"/api/runs/{first.id}/agreement", {"with": source.id})
    assert resp.status_code == 200, resp.json()
    body = resp.json()
    # Attempt 4 got no reward from the judge: not compared. Of 3: one disagreement.
    # p_o = 2/3; A passes 1/3, B 2/3; p_e = 4/9; kappa = (2/9) / (5/9) = 0.4.
    assert body["source_run"] == source.id and body["threshold"] == 1.0
    assert (body["compared"], body["unassessed"], body["only_in_a"], body["only_in_b"]) == (3, 1, 0, 0)
    assert body["confusion"] == {"pass_pass": 1, "pass_fail": 0, "fail_pass": 1, "fail_fail": 1}
    assert body["agreement"] == pytest.approx(2 / 3) and body["kappa"] == pytest.approx(0.4)
    [disagreement] = body["disagreements"]
    judged = first.trials.get(pk=disagreement["a"]["trial"])
    assert disagreement["attempt"] == judged.source_id == disagreement["b"]["trial"]
    assert disagreement["a"] == {"trial": judged.id, "reward": 0.0, "passed": False}
    assert disagreement["b"]["reward"] == 1.0 and disagreement["b"]["passed"] is True
    assert disagreement["task"] == judged.task_version.name


@pytest.mark.django_db
def test_two_judges_and_a_threshold(alice, assessed):
    _, first, second = assessed
    body = alice.client.get(f"/api/runs/{first.id}/agreement", {"with": second.id}).json()
    # B passed all 3 compared: p_e = p_o = 1/3, so kappa is 0 (no better than chance).
    assert body["source_run"] == assessed[0].id
    assert body["confusion"] == {"pass_pass": 1, "pass_fail": 0, "fail_pass": 2, "fail_fail": 0}
    assert body["kappa"] == pytest.approx(0.0) and len(body["disagreements"]) == 2
    # At 0.5 the 4th attempt still has no reward from the first judge; the rest are unchanged.
    lenient = alice.client.get(f"/api/runs/{second.id}/agreement", {"with": first.id, "threshold": 0.5}).json()
    assert lenient["threshold"] == 0.5 and lenient["confusion"]["pass_fail"] == 2


@pytest.mark.django_db
def test_runs_that_did_not_assess_the_same_work_are_refused(alice, bob, assessed):
    source, first, _ = assessed
    same = alice.client.get(f"/api/runs/{first.id}/agreement", {"with": first.id})
    assert same.status_code == 400 and same.json()["error"]["field"] == "with"
    neither = alice.client.get(f"/api/runs/{source.id}/agreement", {"with": source.id})
    assert neither.status_code == 400
    missing = alice.client.get(f"/api/runs/{first.id}/agreement")
    assert missing.status_code == 400 and missing.json()["error"]["field"] == "with"
    # Another organization's run is not found, from either side.
    assert bob.client.get(f"/api/runs/{first.id}/agreement", {"with": source.id}).status_code == 404
    from apps.runs.services import run_submit

    dataset = make_dataset_version(org=alice.org, name="other")
    actor = make_profile_version(org=alice.org, name="other-actor")
    other, _ = run_submit(
        org=alice.org,
        user=None,
        idempotency_key="other",
        body={"kind": "evaluate", "dataset": dataset.reference, "actor": {"profile": actor.profile.name}},
    )
    unrelated = alice.client.get(f"/api/runs/{first.id}/agreement", {"with": other.id})
    assert unrelated.status_code == 400 and "not the same work" in unrelated.json()["error"]["message"]
