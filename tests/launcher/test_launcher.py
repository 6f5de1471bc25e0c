"""launch_plan_build: every engine, every delivery mode, bindings, platform variables, outputs, digests."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from synth_launcher.engines import CLAUDE_CODE_ARGV
from synth_launcher.launcher import (
    CREDENTIAL_MARKER,
    AttemptBinding,
    Bindings,
    LaunchError,
    LaunchPlan,
    ModelBinding,
    RunBinding,
    TaskBinding,
    launch_plan_build,
)

CREDENTIAL = "sk-synth-attempt-0123456789abcdef"
INSTRUCTION = "Fix the failing test in tests/test_app.py."

BINDINGS = Bindings(
    task=TaskBinding(name="team/fix-test", workdir="/app", instruction=INSTRUCTION, agent_timeout_sec=900.0),
    run=RunBinding(id="run_abc", kind="evaluate"),
    attempt=AttemptBinding(trial_id="trl_123", index=2, group_id="grp_9"),
    model=ModelBinding(name="qwen3-8b", base_url="http://127.0.0.1:8377", route="qwen3-8b"),
    credential=CREDENTIAL,
    proxy_address="unix:///run/synth/proxy.sock",
)

CLAUDE: dict[str, Any] = {
    "model": {"route": "qwen3-8b"},
    "engine": {"name": "claude-code", "version": "2.1"},
    "files": [{"path": "CLAUDE.md", "content": "Run the tests before you finish.", "mode": "0644"}],
    "setup": ["pip install -q pytest"],
    "workdir": "${task.workdir}",
    "args": ["--max-turns", "40"],
    "env": {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "8192"},
    "instruction": {"via": "argument"},
    "outputs": [],
    "limits": {"timeout_sec": 1800},
}
COMMAND: dict[str, Any] = {
    "engine": {"name": "command", "version": "1"},
    "command": ["python3", "agent.py"],
    "args": ["--verbose"],
    "limits": {"timeout_sec": 600},
}


def recipe(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def build(r: dict[str, Any], bindings: Bindings = BINDINGS) -> LaunchPlan:
    return launch_plan_build(recipe=r, bindings=bindings)


def error_of(r: dict[str, Any], bindings: Bindings = BINDINGS) -> LaunchError:
    with pytest.raises(LaunchError) as info:
        build(r, bindings)
    assert isinstance(info.value, ValueError)
    return info.value


# ---------------------------------------------------------------- engines


def test_claude_code_plan():
    plan = build(CLAUDE)
    assert plan.engine == "claude-code" and plan.engine_version == "2.1"
    assert plan.argv == (*CLAUDE_CODE_ARGV, "--max-turns", "40", INSTRUCTION)
    assert plan.argv[:7] == (
        "claude",
        "--print",
        "--output-format",
        "stream-json",
        "--verbose",
        "--permission-mode",
        "bypassPermissions",
    )
    assert plan.workdir == "/app"
    assert [f.to_dict() for f in plan.files] == [
        {"path": "/app/CLAUDE.md", "content": "Run the tests before you finish.", "mode": "0644"}
    ]
    assert plan.setup == ("pip install -q pytest",)
    assert plan.instruction_via == "argument" and plan.instruction == INSTRUCTION
    assert plan.transcript_path == "/logs/agent/claude-code.jsonl"
    assert plan.log_path == "/logs/agent/claude-code.txt"
    assert plan.timeout_sec == 900  # the task's own budget is smaller than the recipe's 1800
    assert plan.correlation_id == "trl_123"
    assert plan.model == {
        "name": "qwen3-8b",
        "base_url": "http://127.0.0.1:8377",
        "route": "qwen3-8b",
        "checkpoint": None,
    }
    assert plan.proxy_address == "unix:///run/synth/proxy.sock"


def test_claude_code_platform_env():
    env = build(CLAUDE).env
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "8192"  # the recipe's own
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8377"
    assert env["ANTHROPIC_API_KEY"] == CREDENTIAL_MARKER  # placed at launch, never stored
    for name in (
        "ANTHROPIC_MODEL",
        "ANTHROPIC_DEFAULT_SONNET_MODEL",
        "ANTHROPIC_DEFAULT_OPUS_MODEL",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL",
        "ANTHROPIC_SMALL_FAST_MODEL",
        "CLAUDE_CODE_SUBAGENT_MODEL",
    ):
        assert env[name] == "qwen3-8b", name
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["DISABLE_AUTOUPDATER"] == "1"
    assert env["IS_SANDBOX"] == "1"
    assert env["CLAUDE_CONFIG_DIR"].startswith("/logs/agent/")
    assert env["ANTHROPIC_CUSTOM_HEADERS"] == "x-synth-trial: trl_123"
    assert env["SYNTH_TRIAL_ID"] == "trl_123"
    assert "ANTHROPIC_AUTH_TOKEN" not in env


def test_claude_code_needs_model_and_credential():
    assert error_of(CLAUDE, replace(BINDINGS, model=None)).field == "bindings.model"
    assert error_of(CLAUDE, replace(BINDINGS, credential=None)).field == "bindings.credential"


def test_command_plan():
    plan = build(COMMAND)
    assert plan.argv == ("python3", "agent.py", "--verbose", INSTRUCTION)
    assert plan.log_path == "/logs/agent/command.txt" and plan.transcript_path is None
    assert plan.timeout_sec == 600
    # A model is bound, so the command is routed through the bridge like the harness.
    assert plan.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8377"
    assert plan.env["ANTHROPIC_MODEL"] == "qwen3-8b"


def test_command_without_model():
    plan = build(COMMAND, replace(BINDINGS, model=None, credential=None))
    assert plan.env == {"SYNTH_TRIAL_ID": "trl_123"}
    assert plan.model is None and not plan.needs_credential
    assert plan.exec_env() == {"SYNTH_TRIAL_ID": "trl_123"}


def test_oracle_plan():
    plan = build(
        {"engine": {"name": "oracle", "version": "1"}, "outputs": ["hello.txt"], "limits": {"timeout_sec": 60}}
    )
    assert plan.argv == ("/solution/solve.sh",)
    assert plan.instruction_via == "none" and plan.instruction == ""
    assert plan.env == {"SYNTH_TRIAL_ID": "trl_123"}  # no model routing for the reference solution
    assert plan.log_path == "/logs/agent/oracle.txt"
    assert plan.outputs == ("/app/hello.txt",)


def test_nop_plan():
    plan = build({"engine": {"name": "nop", "version": "1"}, "limits": {"timeout_sec": 60}})
    assert plan.argv == () and plan.instruction_via == "none"
    assert plan.workdir == "/app"  # the default workdir is ${task.workdir}
    assert plan.files == () and plan.setup == () and plan.outputs == ()


# ---------------------------------------------------------------- instruction delivery


def test_instruction_via_stdin():
    plan = build(recipe(COMMAND, instruction={"via": "stdin"}))
    assert plan.argv == ("python3", "agent.py", "--verbose")
    assert plan.instruction_via == "stdin" and plan.instruction == INSTRUCTION


def test_instruction_via_relative_file():
    plan = build(recipe(COMMAND, instruction={"via": "file:docs/TASK.md"}))
    assert plan.argv == ("python3", "agent.py", "--verbose")
    assert plan.instruction_via == "file" and plan.instruction_path == "/app/docs/TASK.md"
    assert plan.instruction == INSTRUCTION


def test_instruction_via_absolute_file_with_binding():
    plan = build(recipe(COMMAND, instruction={"via": "file:/tmp/${run.id}.md"}))
    assert plan.instruction_path == "/tmp/run_abc.md"


def test_instruction_file_may_not_be_a_recipe_file():
    r = recipe(COMMAND, files=[{"path": "TASK.md", "content": "x"}], instruction={"via": "file:TASK.md"})
    assert error_of(r).field == "instruction.via"


def test_instruction_file_may_not_escape():
    assert error_of(recipe(COMMAND, instruction={"via": "file:../etc/TASK.md"})).field == "instruction.via"


# ---------------------------------------------------------------- bindings


def test_binding_substitution_everywhere():
    r = recipe(
        COMMAND,
        workdir="/work/${run.id}",
        command=["run-agent", "--task=${task.name}"],
        args=["--model", "${model.name}", "--timeout", "${task.agent_timeout_sec}"],
        setup=["mkdir -p out/${task.name}", 'echo "$HOME ${HOME} ${X:-default}"'],
        env={"TASK": "${task.name}", "RUN": "${run.kind}/${run.id}", "AUTH": "Bearer ${credential}"},
        outputs=["out/${run.id}.json"],
        instruction={"via": "stdin"},
    )
    plan = build(r)
    assert plan.workdir == "/work/run_abc"
    assert plan.argv == ("run-agent", "--task=team/fix-test", "--model", "qwen3-8b", "--timeout", "900")
    # Shell variables are the shell's.
    assert plan.setup == ("mkdir -p out/team/fix-test", 'echo "$HOME ${HOME} ${X:-default}"')
    assert plan.env["TASK"] == "team/fix-test"
    assert plan.env["RUN"] == "evaluate/run_abc"
    assert plan.env["AUTH"] == "Bearer ${credential}"
    assert plan.exec_env()["AUTH"] == f"Bearer {CREDENTIAL}"
    assert plan.outputs == ("/work/run_abc/out/run_abc.json",)


def test_attempt_bindings():
    plan = build(recipe(COMMAND, env={"ATTEMPT": "${attempt.index}", "GROUP": "${attempt.group_id}"}))
    assert plan.env["ATTEMPT"] == "2" and plan.env["GROUP"] == "grp_9"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"args": ["${task.nope}"]}, "args[0]"),
        ({"env": {"X": "${model.provider}"}}, "env.X"),
        ({"setup": ["echo ${run.owner}"]}, "setup[0]"),
        ({"outputs": ["${task.secret}.txt"]}, "outputs[0]"),
        ({"command": ["${tsak.workdir}/agent"]}, "command[0]"),  # unknown namespace
        ({"workdir": "${task.dir}"}, "workdir"),
    ],
)
def test_unknown_binding_is_named(changes, field):
    error = error_of(recipe(COMMAND, **changes))
    assert error.field == field
    assert "unknown binding" in str(error)


def test_binding_without_a_value():
    error = error_of(recipe(COMMAND, args=["${model.checkpoint}"]))
    assert error.field == "args[0]" and "has no value" in str(error)
    error = error_of(recipe(COMMAND, env={"M": "${model.name}"}), replace(BINDINGS, model=None, credential=None))
    assert error.field == "env.M"


def test_credential_only_in_env():
    assert error_of(recipe(COMMAND, args=["--key", "${credential}"])).field == "args[1]"
    assert error_of(recipe(COMMAND, setup=["login ${credential}"])).field == "setup[0]"
    error = error_of(recipe(COMMAND, env={"MY_KEY": "${credential}"}), replace(BINDINGS, credential=None))
    assert error.field == "env.MY_KEY"


def test_credential_reaching_argv_through_a_binding_is_refused():
    leaky = replace(BINDINGS, task=replace(BINDINGS.task, name=CREDENTIAL))
    error = error_of(recipe(COMMAND, args=["${task.name}"]), leaky)
    assert error.field == "bindings.credential"
    assert CREDENTIAL not in str(error)


@pytest.mark.parametrize(
    ("bindings", "field"),
    [
        (replace(BINDINGS, task=replace(BINDINGS.task, workdir="app")), "bindings.task.workdir"),
        (replace(BINDINGS, task=replace(BINDINGS.task, workdir="/app/../etc")), "bindings.task.workdir"),
        (
            replace(BINDINGS, attempt=replace(BINDINGS.attempt, trial_id="trl_1\r\nx-evil: 1")),
            "bindings.attempt.trial_id",
        ),
        (replace(BINDINGS, attempt=replace(BINDINGS.attempt, index=-1)), "bindings.attempt.index"),
        (replace(BINDINGS, run=replace(BINDINGS.run, id="")), "bindings.run.id"),
        (replace(BINDINGS, model=replace(BINDINGS.model, base_url="127.0.0.1:8377")), "bindings.model.base_url"),
        (replace(BINDINGS, model=replace(BINDINGS.model, name="qwen\n")), "bindings.model.name"),
        (replace(BINDINGS, credential="has space"), "bindings.credential"),
    ],
)
def test_bad_bindings(bindings, field):
    error = error_of(CLAUDE, bindings)
    assert error.field == field
    assert "has space" not in str(error)  # a credential is never echoed


def test_invalid_recipe_is_a_launch_error():
    assert error_of(recipe(CLAUDE, limits=None)).field == "limits"
    assert error_of(recipe(CLAUDE, files=[{"path": "../x", "content": ""}])).field == "files[0].path"
    assert error_of(recipe(CLAUDE, args=["--model", "opus"])).field == "args[0]"


# ---------------------------------------------------------------- platform variables


@pytest.mark.parametrize("name", ["ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_MODEL", "IS_SANDBOX"])
def test_recipe_cannot_set_reserved_variables(name):
    assert error_of(recipe(CLAUDE, env={name: "x"})).field == f"env.{name}"


@pytest.mark.parametrize("name", ["CLAUDE_CONFIG_DIR", "DISABLE_AUTOUPDATER", "disable_autoupdater"])
def test_platform_variable_the_schema_lets_through_is_an_error(name):
    # Not on the schema's reserved list, but the platform sets it for this launch.
    error = error_of(recipe(CLAUDE, env={name: "/tmp/elsewhere"}))
    assert error.field == f"env.{name}"
    assert "set by the platform" in str(error)


def test_platform_value_wins():
    plan = build(CLAUDE)
    assert plan.env["ANTHROPIC_BASE_URL"] == BINDINGS.model.base_url
    assert plan.env["ANTHROPIC_API_KEY"] == CREDENTIAL_MARKER
    # Without a model nothing of the routing set is injected: only the correlation id.
    plan = build(recipe(COMMAND, env={"DISABLE_AUTOUPDATER": "0"}), replace(BINDINGS, model=None, credential=None))
    assert plan.env == {"DISABLE_AUTOUPDATER": "0", "SYNTH_TRIAL_ID": "trl_123"}


# ---------------------------------------------------------------- outputs and paths


def test_required_outputs_resolution():
    r = recipe(COMMAND, outputs=["out.txt", "/app/out.txt", "reports/summary.json", "/logs/agent/extra.log", "./x/./y"])
    assert build(r).outputs == ("/app/out.txt", "/app/reports/summary.json", "/logs/agent/extra.log", "/app/x/y")


def test_output_escape_through_a_binding():
    sneaky = replace(BINDINGS, task=replace(BINDINGS.task, name="../../etc/passwd"))
    assert error_of(recipe(COMMAND, outputs=["${task.name}"]), sneaky).field == "outputs[0]"
    assert error_of(recipe(COMMAND, outputs=["../secret"])).field == "outputs[0]"


@pytest.mark.parametrize("path", ["/", "/logs", "/logs/artifacts", "/logs/artifacts/outputs"])
def test_output_may_not_contain_the_artifacts_directory(path):
    assert error_of(recipe(COMMAND, outputs=[path])).field == "outputs[0]"


def test_workdir_must_be_absolute():
    assert error_of(recipe(COMMAND, workdir="relative/${run.id}")).field == "workdir"


def test_files_resolve_under_a_custom_workdir():
    r = recipe(COMMAND, workdir="/srv/${run.id}", files=[{"path": "a/b.sh", "content": "#!/bin/sh\n", "mode": "0755"}])
    plan = build(r)
    assert [(f.path, f.mode) for f in plan.files] == [("/srv/run_abc/a/b.sh", "0755")]


# ---------------------------------------------------------------- serialisation and digest


def test_to_dict_is_json_and_credential_free():
    plan = build(CLAUDE)
    data = plan.to_dict()
    text = json.dumps(data)
    assert CREDENTIAL not in text
    assert CREDENTIAL not in repr(plan)
    assert data["format"] == "synth.launch-plan/1"
    assert set(data) == {
        "format",
        "engine",
        "engine_version",
        "correlation_id",
        "workdir",
        "files",
        "setup",
        "setup_timeout_sec",
        "argv",
        "env",
        "instruction",
        "outputs",
        "timeout_sec",
        "max_model_calls",
        "fail_on_nonzero_exit",
        "log_path",
        "transcript_path",
        "model",
        "proxy_address",
    }
    assert plan.exec_env()["ANTHROPIC_API_KEY"] == CREDENTIAL
    assert plan.redact(f"key={CREDENTIAL}") == "key=***"


def test_digest_stability():
    first, second = build(CLAUDE), build(copy.deepcopy(CLAUDE))
    assert first.to_dict() == second.to_dict()
    assert first.digest() == second.digest()
    assert json.dumps(first.to_dict(), sort_keys=True) == json.dumps(second.to_dict(), sort_keys=True)
    # The credential is not part of what was decided, so it does not move the digest.
    assert build(CLAUDE, replace(BINDINGS, credential="another-credential")).digest() == first.digest()
    # Anything that was decided does.
    assert build(recipe(CLAUDE, args=["--max-turns", "41"])).digest() != first.digest()
    other_trial = replace(BINDINGS, attempt=replace(BINDINGS.attempt, trial_id="trl_456"))
    assert build(CLAUDE, other_trial).digest() != first.digest()


def test_round_trip():
    plan = build(recipe(COMMAND, instruction={"via": "file:TASK.md"}, outputs=["out.txt"]))
    data = json.loads(json.dumps(plan.to_dict()))
    again = LaunchPlan.from_dict(data, credential=CREDENTIAL)
    assert again == plan
    assert again.to_dict() == plan.to_dict() and again.digest() == plan.digest()
    assert again.exec_env() == plan.exec_env()


def test_from_dict_without_credential_cannot_launch():
    plan = LaunchPlan.from_dict(build(CLAUDE).to_dict())
    assert plan.needs_credential
    with pytest.raises(LaunchError) as info:
        plan.exec_env()
    assert info.value.field == "bindings.credential"


def test_from_dict_rejects_other_documents():
    with pytest.raises(LaunchError):
        LaunchPlan.from_dict({"engine": "nop"})
    data = build(COMMAND).to_dict()
    del data["argv"]
    with pytest.raises(LaunchError):
        LaunchPlan.from_dict(data)
