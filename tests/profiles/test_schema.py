"""Recipe validation without a database: schema paths, launch constraints, canonical bytes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from apps.core.errors import ValidationFailed
from apps.profiles.schema import RECIPE_SCHEMA, recipe_validate
from apps.profiles.services import recipe_canonicalize
from synth_common.canonical import sha256_hex

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

BASE: dict[str, Any] = {
    "model": {"route": "qwen3-8b"},
    "engine": {"name": "claude-code", "version": "2.1"},
    "files": [{"path": "CLAUDE.md", "content": "Run the tests.", "mode": "0644"}],
    "args": ["--max-turns", "40"],
    "env": {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "8192"},
    "instruction": {"via": "argument"},
    "limits": {"timeout_sec": 1800},
}


def recipe(**changes: Any) -> dict[str, Any]:
    """BASE with top-level keys replaced; a value of None removes the key."""
    out = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def field_of(value: Any) -> str | None:
    with pytest.raises(ValidationFailed) as info:
        recipe_validate(recipe=value)
    return info.value.field


@pytest.mark.parametrize(
    "name", ["agent.json", "oracle-agent.json", "noop-agent.json", "train-agent.json", "judge-agent.json"]
)
def test_examples_validate(name):
    recipe_validate(recipe=json.loads((EXAMPLES / name).read_text()))


def test_example_agent_is_the_api_md_profile():
    data = json.loads((EXAMPLES / "agent.json").read_text())
    assert data["model"] == {"route": "qwen3-8b"} and data["engine"]["name"] == "claude-code"


def test_every_object_in_the_schema_forbids_unknown_properties():
    def objects(node: Any):
        if isinstance(node, dict):
            if node.get("type") == "object" and "propertyNames" not in node:
                yield node
            for value in node.values():
                yield from objects(value)
        elif isinstance(node, list):
            for value in node:
                yield from objects(value)

    found = list(objects(RECIPE_SCHEMA))
    assert len(found) >= 6
    assert all(node.get("additionalProperties") is False for node in found)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (recipe(engine={"name": "claud-code", "version": "2.1"}), "engine.name"),
        (recipe(engine={"name": "claude-code"}), "engine.version"),
        (recipe(engine=None), "engine"),
        (recipe(limits=None), "limits"),
        (recipe(limits={"timeout_sec": 0}), "limits.timeout_sec"),
        (recipe(limits={"timeout_sec": "1800"}), "limits.timeout_sec"),
        (recipe(limits={"timeout_sec": 10, "tiemout_sec": 5}), "limits.tiemout_sec"),
        (recipe(timeout_sec=10), "timeout_sec"),
        (recipe(model=None), "model"),  # claude-code needs a model
        (recipe(model={}), "model"),
        (recipe(model={"route": "a", "checkpoint": "ckpt_x"}), "model"),
        (recipe(model={"checkpoint": "run_123"}), "model.checkpoint"),
        (recipe(model={"rout": "qwen3-8b"}), "model.rout"),
        (recipe(files=[{"path": "../escape", "content": ""}]), "files[0].path"),
        (recipe(files=[{"path": "a/../../b", "content": ""}]), "files[0].path"),
        (recipe(files=[{"path": "/etc/passwd", "content": ""}]), "files[0].path"),
        (recipe(files=[{"path": "x", "content": "", "mode": "644"}]), "files[0].mode"),
        (recipe(files=[{"path": "x", "content": "", "mode": "0644\n"}]), "files[0].mode"),  # ECMA "$"
        (recipe(files=[{"path": "x"}]), "files[0].content"),
        (recipe(files=[{"path": "x", "content": ""}, {"path": "./x", "content": ""}]), "files[1].path"),
        (recipe(args=["--max-turns", 40]), "args[1]"),
        (recipe(env={"OK": 1}), "env.OK"),
        (recipe(env={"BAD-NAME": "x"}), "env.BAD-NAME"),
        (recipe(instruction={"via": "socket"}), "instruction.via"),
        (recipe(instruction={"via": "file:../x"}), "instruction.via"),
        (recipe(outputs=["../out"]), "outputs[0]"),
        (recipe(command=["./agent"]), "command"),  # only for engine "command"
        (recipe(engine={"name": "command", "version": "1"}), "command"),  # required there
        (recipe(workdir="${tsak.workdir}"), "workdir"),
        (recipe(args=["--x", "${credential}"]), "args[1]"),  # the credential travels in env only
        (recipe(setup=["echo ${run.}"]), "setup[0]"),
    ],
)
def test_schema_errors_name_the_path(value, field):
    assert field_of(value) == field


def test_schema_error_messages_are_plain():
    with pytest.raises(ValidationFailed) as info:
        recipe_validate(recipe=recipe(limits={"timeout_sec": 10, "tiemout_sec": 5}))
    assert "limits.tiemout_sec is not a known field" in info.value.message
    assert "timeout_sec" in info.value.message  # lists what is allowed
    with pytest.raises(ValidationFailed) as info:
        recipe_validate(recipe=recipe(model=None))
    assert info.value.message == "model is required for engine 'claude-code'"


def test_not_an_object():
    assert field_of([BASE]) is None


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"env": {"ANTHROPIC_BASE_URL": "http://evil"}}, "env.ANTHROPIC_BASE_URL"),
        ({"env": {"ANTHROPIC_API_KEY": "sk-ant-xxx"}}, "env.ANTHROPIC_API_KEY"),
        ({"env": {"ANTHROPIC_AUTH_TOKEN": "${credential}"}}, "env.ANTHROPIC_AUTH_TOKEN"),  # the platform's own
        ({"env": {"ANTHROPIC_MODEL": "opus"}}, "env.ANTHROPIC_MODEL"),
        ({"env": {"ANTHROPIC_DEFAULT_SONNET_MODEL": "x"}}, "env.ANTHROPIC_DEFAULT_SONNET_MODEL"),
        ({"env": {"ANTHROPIC_SMALL_FAST_MODEL": "x"}}, "env.ANTHROPIC_SMALL_FAST_MODEL"),
        ({"env": {"CLAUDE_CODE_SUBAGENT_MODEL": "x"}}, "env.CLAUDE_CODE_SUBAGENT_MODEL"),
        ({"env": {"ANTHROPIC_CUSTOM_HEADERS": "x: y"}}, "env.ANTHROPIC_CUSTOM_HEADERS"),
        ({"env": {"CLAUDE_CODE_USE_BEDROCK": "1"}}, "env.CLAUDE_CODE_USE_BEDROCK"),
        ({"env": {"ANTHROPIC_VERTEX_BASE_URL": "x"}}, "env.ANTHROPIC_VERTEX_BASE_URL"),
        ({"env": {"https_proxy": "http://p"}}, "env.https_proxy"),
        ({"env": {"NO_PROXY": "*"}}, "env.NO_PROXY"),
        ({"env": {"OPENAI_API_KEY": "sk-live"}}, "env.OPENAI_API_KEY"),
        ({"env": {"GITHUB_TOKEN": "ghp_x"}}, "env.GITHUB_TOKEN"),
        ({"env": {"SYNTH_RUN_ID": "run_x"}}, "env.SYNTH_RUN_ID"),
        ({"env": {"IS_SANDBOX": "0"}}, "env.IS_SANDBOX"),
        ({"args": ["--max-turns", "40", "--model", "opus"]}, "args[2]"),
        ({"args": ["--model=opus"]}, "args[0]"),
        ({"args": ["--fallback-model", "x"]}, "args[0]"),
        ({"args": ["-p"]}, "args[0]"),
        ({"args": ["-cp"]}, "args[0]"),
        ({"args": ["--print"]}, "args[0]"),
        ({"args": ["--output-format=json"]}, "args[0]"),
        ({"args": ["--input-format", "text"]}, "args[0]"),
        ({"args": ["--settings", "s.json"]}, "args[0]"),
        ({"args": ["--permission-mode", "plan"]}, "args[0]"),
        ({"args": ["--dangerously-skip-permissions"]}, "args[0]"),
        ({"args": ["--api-key", "k"]}, "args[0]"),
        ({"files": [{"path": "./.claude/settings.json", "content": "{}"}]}, "files[0].path"),
    ],
)
def test_launch_constraints_reject_naming_the_field(changes, field):
    with pytest.raises(ValidationFailed) as info:
        recipe_validate(recipe=recipe(**changes))
    assert info.value.field == field
    assert "reserved by the platform" in info.value.message
    assert info.value.status_code == 400


@pytest.mark.parametrize(
    "changes",
    [
        {"env": {"OPENAI_API_KEY": "${credential}"}},  # the scoped credential under the name a tool expects
        {"env": {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "8192", "HOME": "/root", "WORKDIR": "${task.workdir}"}},
        {
            "args": [
                "--mcp-config",
                ".mcp.json",
                "--strict-mcp-config",
                "--verbose",
                "--append-system-prompt",
                "Be brief.",
            ]
        },
        {"files": [{"path": ".mcp.json", "content": "{}"}, {"path": ".claude/agents/r.md", "content": "x"}]},
        {"setup": ["export PATH=${HOME}/bin:$PATH", "echo ${PY:-python3.12}", "cd ${task.workdir}"]},
        {"instruction": {"via": "file:/tmp/instruction.md"}},
        {"instruction": {"via": "stdin"}},
        {"outputs": ["/logs/agent.txt", "result.json"]},
        {"model": {"checkpoint": "ckpt_01jd2x"}},
        {"limits": {"timeout_sec": 0.5, "setup_timeout_sec": 600, "max_model_calls": 200}},
    ],
)
def test_allowed_recipes(changes):
    recipe_validate(recipe=recipe(**changes))


def test_command_engine_owns_its_argv_and_needs_no_model():
    value = recipe(
        model=None,
        engine={"name": "command", "version": "1"},
        command=["python", "agent.py"],
        args=["--model", "whatever-it-calls-it"],
    )
    recipe_validate(recipe=value)
    with pytest.raises(ValidationFailed) as info:  # its environment is still the platform's
        recipe_validate(recipe={**value, "env": {"ANTHROPIC_BASE_URL": "http://x"}})
    assert info.value.field == "env.ANTHROPIC_BASE_URL"


def test_canonical_bytes_ignore_key_order_and_whitespace():
    a = recipe_canonicalize(recipe=BASE)
    shuffled = json.loads(json.dumps(dict(reversed(list(BASE.items()))), indent=4))
    b = recipe_canonicalize(recipe=shuffled)
    assert a == b and sha256_hex(a) == sha256_hex(b)
    assert b" " not in a.replace(b"Run the tests.", b"")  # no insignificant whitespace
    assert a.startswith(b'{"args":["--max-turns","40"],"engine":')  # keys sorted


def test_canonical_bytes_keep_non_ascii_as_utf8():
    value = recipe(files=[{"path": "NOTES.md", "content": "Grüße, 测试 ✓"}])
    data = recipe_canonicalize(recipe=value)
    assert "Grüße, 测试 ✓".encode() in data
    assert b"\\u" not in data


def test_integral_numbers_canonicalize_as_integers():
    assert recipe_canonicalize(recipe=recipe(limits={"timeout_sec": 1800.0})) == recipe_canonicalize(recipe=BASE)
    assert b'"timeout_sec":0.5' in recipe_canonicalize(recipe=recipe(limits={"timeout_sec": 0.5}))
