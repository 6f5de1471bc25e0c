"""The README's main command, end to end on the embedded default (SQLite, filesystem
broker and object store, local sandbox), with none of the service variables set."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_embedded_default_runs_the_example_evaluation_and_training(tmp_path):
    port = _free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "SYNTH_OBJECT_STORE", "DJANGO_SETTINGS_MODULE")
    }
    proxy_port = _free_port()
    env.update(
        SYNTH_VAR_DIR=str(tmp_path / "var"),
        SYNTH_PORT=str(port),
        SYNTH_PROXY_PORT=str(proxy_port),
        LITELLM_LOCAL_MODEL_COST_MAP="True",
    )
    try:
        out = subprocess.run(
            ["bash", "deploy/embedded.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        run_id = out.stdout.split("== evaluation run\n", 1)[1].splitlines()[0].strip()
        assert run_id.startswith("run_")
        env_cli = dict(
            env,
            SYNTH_API_URL=f"http://127.0.0.1:{port}",
            SYNTH_TOKEN=(tmp_path / "var" / "demo-token").read_text().strip(),
        )

        def cli_json(*args: str) -> Any:
            shown = subprocess.run(
                [str(ROOT / ".venv/bin/synth"), *args, "--json"],
                env=env_cli,
                capture_output=True,
                text=True,
                timeout=60,
            )
            return json.loads(shown.stdout)

        run = cli_json("run", "show", run_id)
        assert run["status"] == "succeeded", (run, out.stdout[-3000:])
        assert run["summary"]["mean_reward"] == 1.0
        assert len(run["summary"]["per_task"]) >= 6
        # The training run, all on SQLite and the filesystem broker.
        train_id = out.stdout.split("== training run\n", 1)[1].splitlines()[0].strip()
        assert train_id.startswith("run_"), out.stdout[-3000:]
        checkpoints = cli_json("run", "checkpoints", train_id)
        steps = json.loads((ROOT / "examples" / "train-plan-digits.json").read_text())["steps"]
        updates = cli_json("run", "updates", train_id)
        updates.sort(key=lambda u: u["step"])
        assert [u["step"] for u in updates] == list(range(steps)), updates
        # A step whose groups all scored alike (every reply all digits, once learned) gives no
        # learning signal: it is skipped and saves nothing. The others each saved a checkpoint,
        # numbered as the update that saved it, that the next batch sampled from.
        applied = [u["step"] for u in updates if u["status"] == "applied"]
        assert applied[:2] == [0, 1], updates
        assert [c["step"] for c in checkpoints] == applied, out.stdout[-3000:]
        assert all(c["parent"] == p["id"] for p, c in zip(checkpoints, checkpoints[1:], strict=False))
        # It learned: every step's batch holds the same two tasks, and the untrained model
        # writes about a quarter digits (each step's mean is over 256 sampled characters, so a
        # run without updates stays within a few hundredths of its first step); a last step
        # at least 0.3 above the first is learning. The plan's sampling seed fixes every
        # attempt's draws, so the curve repeats: measured 0.26, 0.32, 0.92, 1.0.
        rewards = [u["metrics"]["reward_mean"] for u in updates]
        assert rewards[0] < 0.45, rewards
        assert rewards[-1] - rewards[0] >= 0.3, rewards
        # ...and the job printed it: a table of step, reward and loss after the training run.
        table = out.stdout.split("== reward by step\n", 1)[1].splitlines()
        assert table[0].split()[:6] == ["STEP", "STATUS", "DATUMS", "TOKENS", "REWARD", "LOSS"], table
        assert [row.split()[0] for row in table[1 : steps + 1]] == [str(i) for i in range(steps)], table
        # An interactive session: `synth claude` hands its harness the proxy's TCP listener,
        # which samples the default route; the gateway answers /v1 with that address.
        harness = tmp_path / "claude"
        harness.write_text(
            "#!/bin/sh\n"
            'echo "BASE $ANTHROPIC_BASE_URL"\n'
            'curl -sS -H "x-api-key: $ANTHROPIC_AUTH_TOKEN" -H "content-type: application/json" '
            '-d \'{"model": "qwen3-8b", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}\' '
            '"$ANTHROPIC_BASE_URL/v1/messages"\n'
        )
        harness.chmod(0o755)
        session = subprocess.run(
            [str(ROOT / ".venv/bin/synth"), "claude", "--model", "qwen3-8b"],
            env=dict(env_cli, SYNTH_CLAUDE_BIN=str(harness), SYNTH_CONFIG_DIR=str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert session.returncode == 0, session.stderr
        base, answer = session.stdout.split("\n", 1)
        assert base == f"BASE http://127.0.0.1:{proxy_port}"
        message = json.loads(answer)
        assert message["type"] == "message" and message["usage"]["output_tokens"] >= 1, message
        refused = subprocess.run(
            ["curl", "-sS", "-X", "POST", f"http://127.0.0.1:{port}/v1/messages"], capture_output=True, text=True
        )
        error = json.loads(refused.stdout)["error"]
        assert error["type"] == "not_found_error" and f"http://127.0.0.1:{proxy_port}/v1" in error["message"]
        assert (tmp_path / "var" / "synth.sqlite3").exists()  # it really ran on SQLite
        assert any((tmp_path / "var" / "objects").rglob("*"))  # and the filesystem object store
    finally:
        subprocess.run(["bash", "deploy/embedded.sh", "stop"], cwd=ROOT, env=env, capture_output=True, timeout=60)
