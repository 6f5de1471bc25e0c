"""The built-in minimal agent, synth-mini (synth_launcher/mini_agent.py).

Three layers:

* the launch plan of engine synth-mini (pure);
* the agent's loop against a tiny Messages API written here (stdlib http.server in a
  thread): tool execution, the tool_result shape, retries, turn limits, instruction
  sources. The script runs with the HOST's /usr/bin/python3 (3.11, standard library
  only), as in the sandbox, which proves it needs nothing of the project's venv;
* end to end: a real Harbor trial in the local sandbox, RecipeAgent + synth-mini talking
  through the model bridge to the REAL proxy (uvicorn on a Unix socket) whose scripted
  sampler emits Qwen3 native tool-call tokens. The verifier rewards the file the tool
  call wrote, and the proxy captured both calls.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from synth_launcher.engines import SYNTH_MINI_PATH, SYNTH_MINI_SOURCE
from synth_launcher.launcher import (
    AttemptBinding,
    Bindings,
    LaunchError,
    LaunchPlan,
    ModelBinding,
    RunBinding,
    TaskBinding,
    launch_plan_build,
)

MINI = SYNTH_MINI_SOURCE
HOST_PYTHON = "/usr/bin/python3"  # what the sandbox sees (its /usr is the host's, read-only)
ENVIRONMENT = os.environ.get("SYNTH_TEST_ENVIRONMENT", "synth_sandbox.environment:LocalSandboxEnvironment")

needs_host_python = pytest.mark.skipif(not os.access(HOST_PYTHON, os.X_OK), reason=f"no {HOST_PYTHON}")

# ---------------------------------------------------------------- the launch plan

CREDENTIAL = "synm_abc_0123456789abcdef"
INSTRUCTION = "-v is not a flag here: write 42 to answer.txt"
BINDINGS = Bindings(
    task=TaskBinding(name="team/answer", workdir="/app", instruction=INSTRUCTION, agent_timeout_sec=900.0),
    run=RunBinding(id="run_abc", kind="evaluate"),
    attempt=AttemptBinding(trial_id="trl_123", index=0),
    model=ModelBinding(name="qwen3-8b", base_url="http://127.0.0.1:18080", route="qwen3-8b"),
    credential=CREDENTIAL,
)


def mini_recipe(**changes: Any) -> dict[str, Any]:
    recipe: dict[str, Any] = {
        "model": {"route": "qwen3-8b"},
        "engine": {"name": "synth-mini", "version": "1"},
        "args": ["--max-turns", "20"],
        "limits": {"timeout_sec": 600},
    }
    recipe.update(changes)
    return recipe


def test_plan_runs_the_uploaded_script_with_the_platform_env():
    plan = launch_plan_build(recipe=mini_recipe(), bindings=BINDINGS)
    assert plan.argv == (
        "python3",
        "-I",
        SYNTH_MINI_PATH,
        "--transcript",
        "/logs/agent/synth-mini.jsonl",
        "--max-turns",
        "20",
        "--",
        INSTRUCTION,
    )
    assert SYNTH_MINI_PATH == "/installed-agent/synth_mini.py"
    assert plan.transcript_path == "/logs/agent/synth-mini.jsonl"
    assert plan.log_path == "/logs/agent/synth-mini.txt"
    env = plan.exec_env()
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18080"
    assert env["ANTHROPIC_API_KEY"] == CREDENTIAL and plan.env["ANTHROPIC_API_KEY"] == "${credential}"
    assert env["ANTHROPIC_MODEL"] == "qwen3-8b"
    assert env["ANTHROPIC_CUSTOM_HEADERS"] == "x-synth-trial: trl_123"
    assert CREDENTIAL not in json.dumps(plan.to_dict())
    assert LaunchPlan.from_dict(plan.to_dict(), credential=CREDENTIAL) == plan


def test_plan_instruction_deliveries():
    stdin = launch_plan_build(recipe=mini_recipe(instruction={"via": "stdin"}), bindings=BINDINGS)
    assert stdin.argv[-2:] == ("--max-turns", "20") and stdin.instruction_via == "stdin"
    via_file = launch_plan_build(recipe=mini_recipe(instruction={"via": "file:TASK.md"}), bindings=BINDINGS)
    assert via_file.argv[-2:] == ("--instruction-file", "/app/TASK.md")


def test_plan_needs_model_and_credential():
    for bindings, field in (
        (replace(BINDINGS, model=None), "bindings.model"),
        (replace(BINDINGS, credential=None), "bindings.credential"),
    ):
        with pytest.raises(LaunchError) as info:
            launch_plan_build(recipe=mini_recipe(), bindings=bindings)
        assert info.value.field == field


@pytest.mark.parametrize("arg", ["--transcript", "--transcript=/tmp/x", "--instruction-file", "--"])
def test_plan_refuses_the_platforms_flags(arg):
    with pytest.raises(LaunchError) as info:
        launch_plan_build(recipe=mini_recipe(args=["--max-turns", "3", arg]), bindings=BINDINGS)
    assert info.value.field == "args[2]"


def test_plan_refuses_harness_reserved_flags():
    with pytest.raises(LaunchError) as info:
        launch_plan_build(recipe=mini_recipe(args=["--model", "other"]), bindings=BINDINGS)
    assert info.value.field == "args[0]"


# ---------------------------------------------------------------- a tiny Messages API

Reply = tuple[int, dict[str, str], dict[str, Any]]


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(id_: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": id_, "name": name, "input": arguments}


def message(*blocks: dict[str, Any], stop: str | None = None) -> Reply:
    if stop is None:
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    body = {
        "id": f"msg_{os.urandom(4).hex()}",
        "type": "message",
        "role": "assistant",
        "model": "qwen3-test",
        "content": list(blocks),
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    return 200, {"request-id": "req_test"}, body


def error(status: int, kind: str, **headers: str) -> Reply:
    return status, headers, {"type": "error", "error": {"type": kind, "message": kind.replace("_", " ")}}


class FakeApi:
    """Answers POST /v1/messages with the scripted replies in order (or ``reply(body)``)."""

    def __init__(self, replies: list[Reply] | Callable[[dict[str, Any]], Reply]) -> None:
        self.replies = replies
        self.requests: list[dict[str, Any]] = []  # {"path", "headers", "body", "at"}
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.loads(raw)
                api.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                        "at": time.monotonic(),
                    }
                )
                if callable(api.replies):
                    status, headers, payload = api.replies(body)
                elif len(api.requests) <= len(api.replies):
                    status, headers, payload = api.replies[len(api.requests) - 1]
                else:
                    status, headers, payload = error(400, "invalid_request_error")  # script exhausted
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name.replace("_", "-"), value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def last_user_content(self, index: int) -> Any:
        return self.requests[index]["body"]["messages"][-1]["content"]


@pytest.fixture
def api_factory() -> Iterator[Callable[..., FakeApi]]:
    servers: list[FakeApi] = []

    def make(replies: Any) -> FakeApi:
        servers.append(FakeApi(replies))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


class Ran:
    def __init__(self, proc: subprocess.CompletedProcess[str], transcript: Path, seconds: float) -> None:
        self.code = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.seconds = seconds
        lines = transcript.read_text().splitlines() if transcript.exists() else []
        self.transcript = [json.loads(line) for line in lines]

    def kinds(self) -> list[str]:
        return [r["type"] for r in self.transcript]


def run_mini(
    work: Path,
    api: FakeApi,
    *args: str,
    instruction: str | None = "do the task",
    stdin: str = "",
    env: dict[str, str] | None = None,
) -> Ran:
    work.mkdir(exist_ok=True)
    transcript = work.parent / "transcript.jsonl"
    base = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(work.parent),
        "LANG": "C.UTF-8",
        "ANTHROPIC_BASE_URL": api.url,
        "ANTHROPIC_API_KEY": "sk-unit-secret",
        "ANTHROPIC_MODEL": "qwen3-test",
        "ANTHROPIC_CUSTOM_HEADERS": "x-synth-trial: trl_unit\nX-Other: two words",
    }
    base.update(env or {})
    argv = [HOST_PYTHON, "-I", str(MINI), "--transcript", str(transcript), *args]
    if instruction is not None:
        argv += ["--", instruction]
    started = time.monotonic()
    proc = subprocess.run(
        argv,
        cwd=work,
        env={k: v for k, v in base.items() if v is not None},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return Ran(proc, transcript, time.monotonic() - started)


@needs_host_python
def test_tool_loop(tmp_path, api_factory):
    api = api_factory(
        [
            message(text("Let me look."), tool_use("t1", "bash", command="echo hello > note.txt && echo done")),
            message(
                tool_use("t2", "read_file", path="note.txt"),
                tool_use("t3", "write_file", path="sub/a.txt", content="42\n"),
            ),
            message(text("All done.")),
        ]
    )
    work = tmp_path / "work"
    ran = run_mini(work, api, "--max-tokens", "512")
    assert ran.code == 0, ran.stderr
    assert (work / "sub" / "a.txt").read_text() == "42\n"

    assert len(api.requests) == 3
    first = api.requests[0]
    assert first["path"] == "/v1/messages"
    headers = first["headers"]
    assert headers["x-api-key"] == "sk-unit-secret" and "authorization" not in headers
    assert headers["anthropic-version"] == "2023-06-01"
    assert headers["content-type"] == "application/json"
    assert headers["x-synth-trial"] == "trl_unit" and headers["x-other"] == "two words"
    body = first["body"]
    assert body["model"] == "qwen3-test" and body["max_tokens"] == 512 and "stream" not in body
    assert [t["name"] for t in body["tools"]] == ["bash", "read_file", "write_file"]
    assert all(t["input_schema"]["type"] == "object" for t in body["tools"])
    assert str(work) in body["system"]
    assert body["messages"] == [{"role": "user", "content": "do the task"}]

    # The assistant turn goes back as it came; each tool_use gets a tool_result, in order.
    second = api.requests[1]["body"]["messages"]
    assert second[1] == {
        "role": "assistant",
        "content": [text("Let me look."), tool_use("t1", "bash", command="echo hello > note.txt && echo done")],
    }
    assert second[2] == {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "done\n"}]}
    results = api.last_user_content(2)
    assert [r["tool_use_id"] for r in results] == ["t2", "t3"]
    assert results[0] == {"type": "tool_result", "tool_use_id": "t2", "content": "hello\n"}
    assert results[1]["content"] == f"wrote 3 bytes to {work / 'sub' / 'a.txt'}" and "is_error" not in results[1]

    assert "end_turn after 3 turn(s), 3 tool call(s), 30 input / 15 output tokens" in ran.stdout
    assert "All done." in ran.stdout
    assert ran.kinds() == [
        "start", "request", "response", "tool", "request", "response", "tool", "tool", "request", "response", "end",
    ]  # fmt: skip
    requests = [r for r in ran.transcript if r["type"] == "request"]
    # Each message is in the transcript once: a request line carries only what is new.
    assert [r["message_offset"] for r in requests] == [0, 2, 4]
    assert requests[0]["tools"] and "tools" not in requests[1]
    assert ran.transcript[-1]["outcome"] == "end_turn"
    assert "sk-unit-secret" not in json.dumps(ran.transcript)


@needs_host_python
def test_tool_failures_are_is_error_results(tmp_path, api_factory):
    work = tmp_path / "work"
    work.mkdir()
    (work / "lines.txt").write_text("".join(f"line{i}\n" for i in range(1, 11)))
    api = api_factory(
        [
            message(
                tool_use("a", "bash", command="echo oops; exit 3"),
                tool_use("b", "bash", command="sleep 30", timeout=0.5),
                tool_use("c", "read_file", path="missing.txt"),
                tool_use("d", "write_file", path="x.txt"),
                tool_use("e", "browse", url="http://example.com"),
                tool_use("f", "bash", command="head -c 100000 /dev/zero | tr '\\0' x"),
                tool_use("g", "read_file", path=str(work / "lines.txt"), offset=3, limit=2),
                tool_use("h", "bash", command="sleep 30 > /dev/null 2>&1 & echo started"),
            ),
            message(text("Finished.")),
        ]
    )
    ran = run_mini(work, api, "--output-limit", "1000")
    assert ran.code == 0, ran.stderr
    results = {r["tool_use_id"]: r for r in api.last_user_content(1)}
    assert list(results) == list("abcdefgh")
    assert results["a"] == {
        "type": "tool_result",
        "tool_use_id": "a",
        "content": "oops\n[exit code 3]",
        "is_error": True,
    }
    assert results["b"]["is_error"] and "timed out after 0.5s" in results["b"]["content"]
    assert results["c"]["is_error"] and "FileNotFoundError" in results["c"]["content"]
    assert results["d"]["is_error"] and "'content' must be a string" in results["d"]["content"]
    assert results["e"]["is_error"] and "unknown tool 'browse'" in results["e"]["content"]
    big = results["f"]
    assert "is_error" not in big and len(big["content"]) < 1100
    assert "characters omitted" in big["content"] and big["content"].startswith("x" * 400)
    assert results["g"]["content"] == "line3\nline4\n\n[lines 3-4 of 10]"
    # A background process does not hold the call open until it ends.
    assert results["h"]["content"] == "started\n" and "is_error" not in results["h"]


@needs_host_python
def test_retries_overloaded_and_rate_limited(tmp_path, api_factory):
    api = api_factory(
        [
            error(529, "overloaded_error", retry_after="1"),
            error(429, "rate_limit_error", retry_after_ms="10"),
            error(503, "api_error", retry_after="0"),
            message(text("ok")),
        ]
    )
    ran = run_mini(tmp_path / "work", api)
    assert ran.code == 0, ran.stderr
    assert len(api.requests) == 4
    assert all(r["body"] == api.requests[0]["body"] for r in api.requests)
    assert api.requests[1]["at"] - api.requests[0]["at"] >= 0.95  # retry-after: 1 was honoured
    errors = [r for r in ran.transcript if r["type"] == "error"]
    assert [(e["status"], e["retry_in"]) for e in errors] == [(529, 1.0), (429, 0.01), (503, 0.0)]
    assert "overloaded" in errors[0]["error"]


@needs_host_python
def test_refused_and_exhausted_calls_exit_1(tmp_path, api_factory):
    refused = api_factory([error(400, "invalid_request_error")])
    ran = run_mini(tmp_path / "a", refused)
    assert ran.code == 1 and len(refused.requests) == 1
    assert "model call refused: HTTP 400" in ran.stderr
    assert ran.transcript[-1]["outcome"] == "error"

    overloaded = api_factory([error(529, "overloaded_error", retry_after="0")] * 5)
    ran = run_mini(tmp_path / "b", overloaded, "--max-retries", "1")
    assert ran.code == 1 and len(overloaded.requests) == 2
    assert "failed after 2 attempts" in ran.stderr

    api = api_factory([])
    api.url = "http://127.0.0.1:9"  # nothing listens: connection refused, retried, then given up
    ran = run_mini(tmp_path / "c", api, "--max-retries", "0")
    assert ran.code == 1 and "failed after 1 attempts" in ran.stderr


@needs_host_python
def test_max_turns_exit_2(tmp_path, api_factory):
    api = api_factory(
        lambda body: message(tool_use(f"t{len(body['messages'])}", "bash", command="echo x >> count.txt"))
    )
    work = tmp_path / "work"
    ran = run_mini(work, api, "--max-turns", "2")
    assert ran.code == 2, ran.stderr
    assert len(api.requests) == 2
    assert (work / "count.txt").read_text() == "x\nx\n"  # the last turn's tool call still ran
    assert "max_turns after 2 turn(s)" in ran.stdout
    assert ran.transcript[-1]["outcome"] == "max_turns"


@needs_host_python
def test_instruction_sources_and_bearer_auth(tmp_path, api_factory):
    api = api_factory(lambda body: message(text("ok")))
    bearer = {"ANTHROPIC_API_KEY": None, "ANTHROPIC_AUTH_TOKEN": "tok-123"}
    assert run_mini(tmp_path / "a", api, instruction=None, stdin="from stdin\n", env=bearer).code == 0
    (tmp_path / "task.md").write_text("from a file")
    assert run_mini(tmp_path / "b", api, "--instruction-file", str(tmp_path / "task.md"), instruction=None).code == 0
    assert run_mini(tmp_path / "c", api, instruction="--looks-like-a-flag").code == 0
    assert [r["body"]["messages"][0]["content"] for r in api.requests] == [
        "from stdin\n",
        "from a file",
        "--looks-like-a-flag",
    ]
    assert api.requests[0]["headers"]["authorization"] == "Bearer tok-123"
    assert "x-api-key" not in api.requests[0]["headers"]

    ran = run_mini(tmp_path / "d", api, instruction=None, stdin="")
    assert ran.code == 1 and "no instruction" in ran.stderr
    ran = run_mini(tmp_path / "e", api, env={"ANTHROPIC_MODEL": None})
    assert ran.code == 1 and "ANTHROPIC_MODEL is not set" in ran.stderr
    assert len(api.requests) == 3


def test_script_is_standard_library_only_and_python39():
    source = MINI.read_text()
    tree = ast.parse(source, feature_version=(3, 9))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    assert "apps" not in imported and "django" not in imported


# ---------------------------------------------------------------- end to end, through the real proxy

TASK_TOML = """\
schema_version = "1.4"

[task]
name = "synth/answer-42"

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 60.0

[environment]
workdir = "/app"
"""
TEST_SH = """\
#!/bin/bash
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
ROUTE = "qwen3-mini"
TOOL_CALL = (
    'I will write the answer.\n<tool_call>\n{"name": "bash", "arguments": '
    '{"command": "echo 42 > /app/answer.txt"}}\n</tool_call><|im_end|>'
)
FINAL = "The answer is in /app/answer.txt.<|im_end|>"


def _environment_missing() -> str | None:
    module, _, name = ENVIRONMENT.partition(":")
    try:
        getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        return f"{ENVIRONMENT} is not available: {exc}"
    if os.geteuid() != 0:
        return "the model bridge needs root (entering the sandbox's network namespace)"
    return None


class UdsProxy:
    """The model proxy's ASGI application under uvicorn in a thread, on a Unix socket."""

    def __init__(self, path: Path) -> None:
        import uvicorn

        from synth_project.proxy_asgi import application

        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.server = uvicorn.Server(uvicorn.Config(application, lifespan="off", log_level="warning"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True)

    def __enter__(self) -> UdsProxy:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.sock.close()


@pytest.fixture
def proxy_socket(transactional_db, settings, monkeypatch) -> Iterator[Path]:
    """A live proxy on a Unix socket, with the qwen3 tokenizer and no broker traffic."""
    from apps.proxy import capture
    from apps.proxy.prefix_cache import cache as prefix_cache
    from apps.proxy.samplers.factory import sampler_cache_clear
    from apps.proxy.tokenizers import provision
    from tests.proxy.conftest import TOKENIZER_DIR

    provision(["qwen3"], root=TOKENIZER_DIR)
    settings.SYNTH_TOKENIZER_DIR = TOKENIZER_DIR
    monkeypatch.setattr(capture, "publish_enqueue", lambda *, interaction_id: None)
    prefix_cache.clear()
    directory = Path(tempfile.mkdtemp(prefix="synth-mini-", dir="/tmp"))  # AF_UNIX paths are short
    try:
        with UdsProxy(directory / "proxy.sock") as proxy:
            yield proxy.path
    finally:
        sampler_cache_clear()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(_environment_missing() is not None, reason=str(_environment_missing()))
@needs_host_python
def test_trial_through_the_real_proxy(tmp_path, proxy_socket):
    from harbor.models.task.task import Task
    from harbor.models.trial.config import EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    from apps.accounts.services import model_credential_issue
    from apps.proxy import capture
    from apps.proxy.models import Interaction
    from apps.proxy.tokenizers import tokenizer_load
    from synth_launcher.harbor_agent import recipe_agent_config
    from tests.conftest import make_member
    from tests.proxy.conftest import TOKENIZER_DIR, make_route, scripted

    task_dir = tmp_path / "answer-42"
    for sub in ("environment", "tests"):
        (task_dir / sub).mkdir(parents=True)
    (task_dir / "task.toml").write_text(TASK_TOML)
    (task_dir / "instruction.md").write_text("Write the number 42 into /app/answer.txt.\n")
    (task_dir / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (task_dir / "tests" / "test.sh").write_text(TEST_SH)

    tokenizer = tokenizer_load("qwen3", root=TOKENIZER_DIR)
    make_route(ROUTE, backend="scripted", config=scripted(tokenizer, TOOL_CALL, FINAL))
    member = make_member("team", "alice")
    trial_id = f"trl_{os.urandom(5).hex()}"
    _, secret = model_credential_issue(
        org=member.org, run_id="run_mini", trial_id=trial_id, route=ROUTE, snapshot="", ttl=timedelta(hours=1)
    )

    task = Task(task_dir)
    bindings = Bindings(
        task=TaskBinding(
            name=task.name,
            workdir=task.config.environment.workdir,
            instruction=task.instruction,
            agent_timeout_sec=task.config.agent.timeout_sec,
        ),
        run=RunBinding(id="run_mini", kind="evaluate"),
        attempt=AttemptBinding(trial_id=trial_id, index=0),
        # The bridge inside the sandbox: 127.0.0.1:<model_port> (default 18080) -> proxy.sock.
        model=ModelBinding(name=ROUTE, base_url="http://127.0.0.1:18080", route=ROUTE),
        credential=secret,
    )
    recipe = mini_recipe(args=["--max-turns", "5", "--max-tokens", "256"], outputs=["answer.txt"])
    recipe["model"] = {"route": ROUTE}
    recipe["limits"] = {"timeout_sec": 60}
    plan = launch_plan_build(recipe=recipe, bindings=bindings)
    trials_dir = tmp_path / "trials"
    config = TrialConfig(
        task=TaskConfig(path=task_dir),
        trial_name=trial_id,
        trials_dir=trials_dir,
        agent=recipe_agent_config(plan=plan),
        environment=EnvironmentConfig(import_path=ENVIRONMENT, kwargs={"model_socket": str(proxy_socket)}),
    )

    async def main() -> Any:
        trial = await Trial.create(config)
        return await trial.run()

    result = asyncio.run(main())
    trial_dir = trials_dir / trial_id
    agent_log = (
        (trial_dir / "agent" / "synth-mini.txt").read_text()
        if (trial_dir / "agent" / "synth-mini.txt").exists()
        else ""
    )
    assert result.exception_info is None, (result.exception_info, agent_log)
    assert result.verifier_result.rewards["reward"] == 1.0, agent_log
    metadata = result.agent_result.metadata
    assert metadata["engine"] == "synth-mini" and metadata["exit_code"] == 0
    assert len(metadata["synth_mini_sha256"]) == 64
    assert "end_turn after 2 turn(s), 1 tool call(s)" in agent_log

    # The agent's transcript: two calls, the tool call answered by a tool_result.
    lines = [json.loads(line) for line in (trial_dir / "agent" / "synth-mini.jsonl").read_text().splitlines()]
    assert [r["type"] for r in lines] == ["start", "request", "response", "tool", "request", "response", "end"]
    first = lines[2]["body"]
    assert first["stop_reason"] == "tool_use"
    call = next(b for b in first["content"] if b["type"] == "tool_use")
    assert call["name"] == "bash" and call["input"] == {"command": "echo 42 > /app/answer.txt"}
    assert lines[4]["messages"][-1]["content"] == [
        {"type": "tool_result", "tool_use_id": call["id"], "content": "[no output]"}
    ]
    assert lines[5]["body"]["stop_reason"] == "end_turn"
    assert lines[0]["python"].startswith("3.") and lines[0]["base_url"] == "http://127.0.0.1:18080"

    # The proxy captured both calls, attributed to this attempt by credential and header.
    rows = list(Interaction.objects.filter(trial_id=trial_id).order_by("created_at"))
    assert [r.stop_reason for r in rows] == ["tool_use", "end_turn"]
    assert all(
        r.principal_kind == "attempt"
        and r.run_id == "run_mini"
        and r.correlation_id == trial_id
        and r.route.name == ROUTE
        and r.model_requested == ROUTE
        and not r.stream
        for r in rows
    )
    second_request = json.loads(capture.staged_payload(interaction=rows[1])["request_json"])
    assert second_request["messages"][-1]["content"][0]["tool_use_id"] == call["id"]

    # The scoped credential appears in no file of the trial.
    for path in trial_dir.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path
