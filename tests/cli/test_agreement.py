"""`synth run agreement A B` against a live server."""

from __future__ import annotations

import json

import pytest

from tests.factories import make_assessed_runs


@pytest.fixture
def assessed(alice):
    source, (judged,) = make_assessed_runs(
        org=alice.org, original=[1.0, 1.0, 0.0, 0.0], regrades=[[1.0, 0.0, 0.0, 0.0]]
    )
    return source, judged


def test_agreement_prints_kappa_the_matrix_and_the_disagreements(synth, assessed):
    source, judged = assessed
    body = synth.json("run", "agreement", judged.id, source.id)
    # 4 compared, 3 agree; A passes 1/4, B 2/4; p_e = 1/4*1/2 + 3/4*1/2 = 1/2; kappa = (3/4-1/2)/(1/2).
    assert body["compared"] == 4 and body["agreement"] == pytest.approx(0.75)
    assert body["kappa"] == pytest.approx(0.5)
    assert body["confusion"] == {"pass_pass": 1, "pass_fail": 0, "fail_pass": 1, "fail_fail": 2}
    [disagreement] = body["disagreements"]
    assert disagreement["a"]["reward"] == 0.0 and disagreement["b"]["reward"] == 1.0

    human = synth("run", "agreement", judged.id, source.id)
    assert human.exit_code == 0, human.stderr
    assert "0.500" in human.stdout and "0.750" in human.stdout  # kappa and agreement
    assert disagreement["attempt"] in human.stdout and "Disagreements" in human.stdout

    lenient = synth.json("run", "agreement", judged.id, source.id, "--threshold", "0")
    assert lenient["threshold"] == 0.0 and lenient["agreement"] == 1.0 and lenient["kappa"] is None
    assert json.loads(json.dumps(lenient))["disagreements"] == []


def test_agreement_of_runs_that_assessed_different_work_fails_with_the_reason(synth, assessed):
    source, _ = assessed
    result = synth("run", "agreement", source.id, source.id)
    assert result.exit_code == 1
    assert "compare two different runs" in result.stderr
