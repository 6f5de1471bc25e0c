"""Engine mini-swe-agent: its launch plan, and the pinned harness in the local sandbox.

Two layers:

* the launch plan (pure): the ``mini`` command line the platform builds (headless, the
  bridge's /v1, ``openai/<route>``, the correlation header, the trajectory as transcript),
  its environment (the credential as OPENAI_API_KEY, litellm offline), and what a recipe
  may not set;
* the harness itself: a real Harbor trial in the local bubblewrap sandbox running the venv
  that deploy/harnesses.sh built from the lock (bound read-only, as the trials worker binds
  it), talking through the model bridge to a small Chat Completions server on the bridge's
  Unix socket. It shows what the harness sends (only POST /v1/chat/completions, the bare
  route, the scoped credential, the header; tool calls, not text actions) and that it looks
  up no host name: the only name the sandbox's DNS stub records is the one the scripted
  command itself asks for.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socketserver
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from synth_launcher.engines import ENGINES, MINI_SWE_AGENT_HOME, MINI_SWE_AGENT_TREE
from synth_launcher.launcher import (
    AttemptBinding,
    Bindings,
    LaunchError,
    LaunchPlan,
    ModelBinding,
    RunBinding,
    TaskBinding,
    launch_plan_build,
    recipe_launch_check,
)
from synth_launcher.recipe import recipe_validate

CREDENTIAL = "synm_abc_0123456789abcdef"
INSTRUCTION = "-v is not a flag here: write ok to out.txt"
BINDINGS = Bindings(
    task=TaskBinding(name="team/ok", workdir="/app", instruction=INSTRUCTION, agent_timeout_sec=900.0),
    run=RunBinding(id="run_abc", kind="evaluate"),
    attempt=AttemptBinding(trial_id="trl_123", index=0),
    model=ModelBinding(name="qwen3-8b", base_url="http://127.0.0.1:18080", route="qwen3-8b"),
    credential=CREDENTIAL,
)
PLATFORM_TAIL = (
    "-c",
    "model.model_kwargs.api_base=http://127.0.0.1:18080/v1",
    "-c",
    'model.model_kwargs.extra_headers={"x-synth-trial": "trl_123"}',
    "-c",
    "model.cost_tracking=ignore_errors",
    "--task",
    INSTRUCTION,
)


def recipe(**changes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": {"route": "qwen3-8b"},
        "engine": {"name": "mini-swe-agent", "version": "2.4.6"},
        "limits": {"timeout_sec": 600},
    }
    out.update(changes)
    return out


# ---------------------------------------------------------------- the launch plan


def test_plan_runs_mini_headless_through_the_bridge():
    plan = launch_plan_build(recipe=recipe(), bindings=BINDINGS)
    assert plan.argv == (
        f"{MINI_SWE_AGENT_HOME}/bin/python",
        "-I",
        "-m",
        "minisweagent.run.mini",
        "--yolo",
        "--exit-immediately",
        "--cost-limit",
        "0",
        "--model",
        "openai/qwen3-8b",
        "--output",
        "/logs/agent/mini-swe-agent.traj.json",
        "-c",
        "mini.yaml",
        *PLATFORM_TAIL,
    )
    assert plan.transcript_path == "/logs/agent/mini-swe-agent.traj.json"
    assert plan.log_path == "/logs/agent/mini-swe-agent.txt"
    env = plan.exec_env()
    assert env["OPENAI_API_KEY"] == CREDENTIAL and plan.env["OPENAI_API_KEY"] == "${credential}"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and env["LITELLM_OFFLINE_MODE"] == "true"
    assert env["MSWEA_CONFIGURED"] == "true" and env["MSWEA_GLOBAL_CONFIG_DIR"] == "/logs/agent/mini-swe-agent"
    assert CREDENTIAL not in json.dumps(plan.to_dict())
    assert LaunchPlan.from_dict(plan.to_dict(), credential=CREDENTIAL) == plan
    engine = ENGINES["mini-swe-agent"]
    assert engine.harness_tree == MINI_SWE_AGENT_TREE and engine.host_binary is None
    assert engine.needs_model and engine.transcript == "mini-swe-agent.traj.json"


def test_recipe_args_choose_the_config_and_the_platforms_specs_come_last():
    plan = launch_plan_build(
        recipe=recipe(args=["-c", "mini_textbased.yaml", "--config=agent.step_limit=30"]), bindings=BINDINGS
    )
    at = plan.argv.index("--output") + 2
    # A recipe that names config specs replaces mini's default, as `mini -c` does.
    assert plan.argv[at:] == ("-c", "mini_textbased.yaml", "--config=agent.step_limit=30", *PLATFORM_TAIL)
    other = launch_plan_build(recipe=recipe(args=["-c", "environment.timeout=120"]), bindings=BINDINGS)
    assert "mini.yaml" not in other.argv


def test_needs_model_and_credential():
    for bindings, field in (
        (replace(BINDINGS, model=None), "bindings.model"),
        (replace(BINDINGS, credential=None), "bindings.credential"),
    ):
        with pytest.raises(LaunchError) as info:
            launch_plan_build(recipe=recipe(), bindings=bindings)
        assert info.value.field == field
    with pytest.raises(LaunchError) as info:
        recipe_validate(recipe={k: v for k, v in recipe().items() if k != "model"})
    assert info.value.field == "model"


@pytest.mark.parametrize("via", ["stdin", "file:TASK.md"])
def test_the_instruction_comes_on_the_command_line(via):
    with pytest.raises(LaunchError) as info:
        recipe_launch_check(recipe=recipe(instruction={"via": via}))
    assert info.value.field == "instruction.via" and "--task" in info.value.message


@pytest.mark.parametrize(
    "arg", ["--model", "-m", "--model=x", "--task", "-t", "--output", "-o", "--yolo", "--exit-immediately", "-l"]
)
def test_refuses_the_platforms_flags(arg):
    with pytest.raises(LaunchError) as info:
        recipe_validate(recipe=recipe(args=["-c", "mini.yaml", arg]))
    assert info.value.field == "args[2]"


@pytest.mark.parametrize(
    "spec",
    [
        "model.model_name=openai/gpt-5",
        "model.model_kwargs.api_base=https://example.com/v1",
        "model.model_kwargs.api_key=sk-x",
        "model.model_kwargs.extra_headers.x-synth-trial=forged",
        "agent.output_path=/tmp/t.json",
        "agent.mode=confirm",
        "run.task=something else",
    ],
)
def test_refuses_the_platforms_config_keys(spec):
    for args, field in ((["-c", "mini.yaml", "-c", spec], "args[3]"), ([f"--config={spec}"], "args[0]")):
        with pytest.raises(LaunchError) as info:
            recipe_launch_check(recipe=recipe(args=args))
        assert info.value.field == field, (args, info.value.message)


def test_other_config_keys_and_files_are_the_recipes():
    for args in (["-c", "mini.yaml", "-c", "model.model_kwargs.temperature=0"], ["-c", "agent.step_limit=5"]):
        recipe_launch_check(recipe=recipe(args=args))


def test_platform_variables_are_refused():
    for name in ("OPENAI_API_KEY", "LITELLM_OFFLINE_MODE", "MSWEA_GLOBAL_CONFIG_DIR"):
        with pytest.raises(LaunchError) as info:
            recipe_launch_check(recipe=recipe(env={name: "x"}))
        assert info.value.field == f"env.{name}"


# ---------------------------------------------------------------- the harness in the sandbox

ENVIRONMENT = os.environ.get("SYNTH_TEST_ENVIRONMENT", "synth_sandbox.environment:LocalSandboxEnvironment")
ROUTE = "qwen3-msa"
PROBE_HOST = "probe-name.invalid"
FIRST_COMMAND = f"getent hosts {PROBE_HOST}; echo ok > /app/out.txt"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
TASK_TOML = """\
schema_version = "1.4"

[task]
name = "synth/mini-swe-agent-ok"

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 600.0

[environment]
workdir = "/app"
"""
TEST_SH = """\
#!/bin/bash
if [ "$(cat /app/out.txt 2>/dev/null)" = "ok" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


class ChatServer:
    """A Chat Completions endpoint on a Unix socket that answers with bash tool calls: the
    first command, then the submission; it keeps every request it saw."""

    def __init__(self, path: Path) -> None:
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                server.requests.append({"method": "GET", "path": self.path})
                self._reply(404, {"error": {"message": "no such path", "type": "invalid_request_error"}})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                server.requests.append(
                    {"method": "POST", "path": self.path, "headers": dict(self.headers.items()), "body": body}
                )
                n = sum(1 for r in server.requests if r["method"] == "POST")
                command = FIRST_COMMAND if n == 1 else SUBMIT
                call = {"id": f"call_{n}", "type": "function", "function": {"name": "bash"}}
                call["function"]["arguments"] = json.dumps({"command": command})
                message = {"role": "assistant", "content": "Running a command.", "tool_calls": [call]}
                self._reply(
                    200,
                    {
                        "id": f"chatcmpl-{n}",
                        "object": "chat.completion",
                        "created": 1,
                        "model": body.get("model"),
                        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls", "logprobs": None}],
                        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
                    },
                )

            def address_string(self) -> str:  # a Unix socket's peer has no host
                return "bridge"

            def log_message(self, *args: Any) -> None:
                pass

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.path = path
        self.server = Server(str(path), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    directory = Path(tempfile.mkdtemp(prefix="synth-msa-", dir="/tmp"))  # AF_UNIX paths are short
    try:
        with ChatServer(directory / "chat.sock") as server:
            yield server
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _harness_tree() -> Path:
    from apps.trials.harnesses import harness_tree_resolve

    return harness_tree_resolve(tree=MINI_SWE_AGENT_TREE)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the model bridge needs root (entering the sandbox's network namespace)")
def test_the_pinned_harness_runs_offline_in_the_sandbox(tmp_path, chat_server):
    from harbor.models.task.task import Task
    from harbor.models.trial.config import EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    from synth_launcher.harbor_agent import recipe_agent_config
    from synth_sandbox.environment import trial_observations

    tree = _harness_tree()  # deploy/harnesses.sh built it; a missing one fails here, with the fix
    task_dir = tmp_path / "ok"
    for sub in ("environment", "tests"):
        (task_dir / sub).mkdir(parents=True)
    (task_dir / "task.toml").write_text(TASK_TOML)
    (task_dir / "instruction.md").write_text("Write ok into /app/out.txt.\n")
    (task_dir / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (task_dir / "tests" / "test.sh").write_text(TEST_SH)
    task = Task(task_dir)
    trial_id = f"trl_{os.urandom(5).hex()}"
    bindings = Bindings(
        task=TaskBinding(name=task.name, workdir="/app", instruction=task.instruction, agent_timeout_sec=600.0),
        run=RunBinding(id="run_msa", kind="evaluate"),
        attempt=AttemptBinding(trial_id=trial_id, index=0),
        model=ModelBinding(name=ROUTE, base_url="http://127.0.0.1:18080", route=ROUTE),
        credential=CREDENTIAL,
    )
    plan = launch_plan_build(recipe=recipe(model={"route": ROUTE}, outputs=["out.txt"]), bindings=bindings)
    trials_dir = tmp_path / "trials"
    config = TrialConfig(
        task=TaskConfig(path=task_dir),
        trial_name=trial_id,
        trials_dir=trials_dir,
        agent=recipe_agent_config(plan=plan),
        environment=EnvironmentConfig(
            import_path=ENVIRONMENT,
            kwargs={
                "model_socket": str(chat_server.path),
                "extra_ro_binds": [f"{tree}:{MINI_SWE_AGENT_TREE.target}"],
            },
        ),
    )
    observed: dict[str, Any] = {}

    async def main() -> Any:
        trial = await Trial.create(config)
        result = await trial.run()
        observed["agent"] = trial_observations(trial_dir=trials_dir / trial_id, phase="agent")
        return result

    result = asyncio.run(main())
    trial_dir = trials_dir / trial_id
    log = trial_dir / "agent" / "mini-swe-agent.txt"
    agent_log = log.read_text() if log.exists() else ""
    # On a loaded machine the harness's start (litellm's import) is slow: the deadline is the
    # recipe's 600 s, so a failure here is the harness's, shown with its log and requests.
    assert result.exception_info is None, (result.exception_info, agent_log, chat_server.requests)
    assert result.agent_result.metadata["exit_code"] == 0, agent_log
    assert result.verifier_result.rewards["reward"] == 1.0, agent_log

    # What the harness sent: two Chat Completions calls and nothing else, to the bridge's /v1,
    # with the bare route, the scoped credential and the correlation header, the bash tool.
    assert [(r["method"], r["path"]) for r in chat_server.requests] == [("POST", "/v1/chat/completions")] * 2, agent_log
    for request in chat_server.requests:
        headers = {k.lower(): v for k, v in request["headers"].items()}
        assert headers["authorization"] == f"Bearer {CREDENTIAL}"
        assert headers["x-synth-trial"] == trial_id
        body = request["body"]
        assert body["model"] == ROUTE and not body.get("stream")
        assert [t["function"]["name"] for t in body["tools"]] == ["bash"]
    second = chat_server.requests[1]["body"]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    assert INSTRUCTION_TEXT in second[1]["content"]
    assert second[2]["tool_calls"][0]["function"]["arguments"] == json.dumps({"command": FIRST_COMMAND})
    assert second[3]["tool_call_id"] == "call_1" and '"returncode": 0' in second[3]["content"]

    # Offline: the only host name looked up during the agent phase is the command's own.
    assert observed["agent"].network == [PROBE_HOST]

    # The trajectory is the transcript: mini's own record of the run, ended by the submission.
    trajectory = json.loads((trial_dir / "agent" / "mini-swe-agent.traj.json").read_text())
    assert trajectory["info"]["exit_status"] == "Submitted" and trajectory["info"]["mini_version"] == "2.4.6"
    assert [m["role"] for m in trajectory["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "exit",
    ]
    for path in trial_dir.rglob("*"):
        if path.is_file():
            assert CREDENTIAL not in path.read_text(errors="replace"), path


INSTRUCTION_TEXT = "Write ok into /app/out.txt."


def test_the_example_profile_launches():
    from tests.trials.conftest import EXAMPLES

    recipe_launch_check(recipe=json.loads((EXAMPLES / "mini-swe-agent.json").read_text()))


def test_the_trajectory_is_published_as_the_transcript():
    from apps.trials.publish import _artifact_kind

    assert _artifact_kind("agent/mini-swe-agent.traj.json") == "transcript"
    assert _artifact_kind("agent/claude-code.jsonl") == "transcript"
    assert _artifact_kind("agent/mini-swe-agent/last_mini_run.traj.json") == "agent"
    assert _artifact_kind("agent/mini-swe-agent.txt") == "agent"
