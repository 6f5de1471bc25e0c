"""Engine codex in the local sandbox, through the trial pipeline and the model bridge, against a
scripted Responses server standing on the proxy's socket (tests/harness/codex_recorder.py):
the host's Codex executable is bound and runs as the sandbox's user, reads the config the
launcher wrote into its CODEX_HOME, sends the attempt's credential and trial header to the
bridge, runs its shell tool in the workdir, and its JSONL transcript is kept as an artifact."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from apps.accounts.models import ModelCredential
from apps.objects.services import object_read
from apps.trials.pipeline import trial_execute
from tests.harness import codex_recorder
from tests.trials.test_model_access import ROUTE, _trial, no_broker, route  # noqa: F401 - fixtures

RECIPE = {
    "model": {"route": ROUTE},
    "engine": {"name": "codex", "version": "0.171.0"},
    "files": [{"path": "AGENTS.md", "content": "Work in /app."}],
    "limits": {"timeout_sec": 120},
}
CHECK = (
    '[ "$(cat /app/out.txt)" = recorded ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt'
)


@pytest.fixture
def scripted_responses(settings):
    """The recorder's scripted Responses server on the socket the bridge forwards to."""
    directory = Path(tempfile.mkdtemp(prefix="synth-cx-"))
    out = directory / "requests"
    out.mkdir()
    recorder = codex_recorder.Recorder(out=out)
    server = codex_recorder.serve(recorder=recorder, uds=directory / "proxy.sock")
    settings.SYNTH_PROXY_SOCKET = directory / "proxy.sock"
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.usefixtures("route", "no_broker")
def test_codex_runs_in_the_sandbox_through_the_bridge(transactional_db, alice, tmp_path, scripted_responses):
    trial = _trial(alice, tmp_path, RECIPE, test=CHECK)
    trial_execute(trial_id=trial.id)
    trial.refresh_from_db()
    assert trial.status == "succeeded", (trial.error_type, trial.error_message)
    assert trial.reward == 1.0, trial.rewards

    cred = ModelCredential.objects.get(trial_id=trial.id)
    requests = [json.loads(p.read_text()) for p in sorted(scripted_responses.out.glob("*.json"))]
    assert [(r["method"], r["path"]) for r in requests] == [("POST", "/v1/responses")] * 2
    for r in requests:
        assert r["headers"]["x-synth-trial"] == trial.id
        assert r["headers"]["authorization"] == "Bearer <other>"  # a credential, and not the recorder's
        assert r["body"]["model"] == ROUTE
    # The conversation Codex sent back carries its shell call's output.
    outputs = [i for i in requests[1]["body"]["input"] if i.get("type") == "function_call_output"]
    assert len(outputs) == 1 and "recorded" in outputs[0]["output"]
    # The recipe's AGENTS.md reached Codex's instructions.
    assert "Work in /app." in json.dumps(requests[0]["body"]["input"])

    names = set(trial.artifacts.values_list("name", flat=True))
    assert {"agent/codex.jsonl", "agent/codex.txt"} <= names
    assert not any("codex-home" in name for name in names)  # CODEX_HOME is not collected
    transcript = trial.artifacts.get(name="agent/codex.jsonl")
    assert transcript.kind == "transcript"
    events = [json.loads(line) for line in object_read(obj=transcript.object).decode().splitlines() if line.strip()]
    commands = [e["item"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == "command_execution"]
    assert [c["exit_code"] for c in commands] == [0] and "echo recorded" in commands[0]["command"]
    assert events[-1]["type"] == "turn.completed"
    secret_head = f"synm_{cred.prefix}_".encode()
    for artifact in trial.artifacts.select_related("object"):
        assert secret_head not in object_read(obj=artifact.object), artifact.name
