"""Engine codex: the plan (argv, env, the config.toml the launcher writes), what a recipe may
not set, and the real Codex CLI reading that config: its call reaches the bridge's
/v1/responses with the attempt's credential and correlation header, nothing else."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from synth_launcher.engines import CODEX_ARGV, CODEX_CREDENTIAL_ENV, CODEX_HOME_ROOT, codex_home
from synth_launcher.launcher import (
    CREDENTIAL_MARKER,
    TRIAL_HEADER,
    AttemptBinding,
    Bindings,
    LaunchError,
    LaunchPlan,
    ModelBinding,
    RunBinding,
    TaskBinding,
    launch_plan_build,
)
from synth_launcher.recipe import RecipeInvalid, recipe_validate
from tests.harness import codex_recorder

ROOT = Path(__file__).resolve().parents[2]
CREDENTIAL = "synm_codexunit_0123456789abcdef"
BINDINGS = Bindings(
    task=TaskBinding(name="team/fix", workdir="/app", instruction="-v: fix the test", agent_timeout_sec=900.0),
    run=RunBinding(id="run_abc", kind="evaluate"),
    attempt=AttemptBinding(trial_id="trl_cx1", index=0, group_id="grp_1"),
    model=ModelBinding(name="qwen3-8b", base_url="http://127.0.0.1:8377", route="qwen3-8b"),
    credential=CREDENTIAL,
)
CODEX: dict[str, Any] = {
    "model": {"route": "qwen3-8b"},
    "engine": {"name": "codex", "version": "0.171.0"},
    "files": [{"path": "AGENTS.md", "content": "Run the tests before you finish."}],
    "args": ["--ephemeral"],
    "limits": {"timeout_sec": 600},
}


def recipe(**changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(CODEX)
    out.update(changes)
    return out


def config_of(plan: LaunchPlan) -> tuple[str, dict[str, Any]]:
    [config] = [f for f in plan.files if f.path.endswith("/config.toml")]
    return config.path, tomllib.loads(config.content)


def test_codex_plan_runs_codex_exec_headless_with_the_instruction_after_double_dash():
    plan = launch_plan_build(recipe=recipe(), bindings=BINDINGS)
    assert plan.engine == "codex"
    # The instruction starts with "-": after "--" it cannot be read as an option.
    assert plan.argv == (*CODEX_ARGV, "--ephemeral", "--", "-v: fix the test")
    assert CODEX_ARGV[:3] == ("codex", "exec", "--json")
    assert plan.transcript_path == "/logs/agent/codex.jsonl" and plan.log_path == "/logs/agent/codex.txt"
    assert plan.env["CODEX_HOME"] == f"{CODEX_HOME_ROOT}/logs/agent" == codex_home(logs_dir="/logs/agent")
    # The config names the variable; the variable holds the marker the credential replaces at launch.
    assert plan.env[CODEX_CREDENTIAL_ENV] == CREDENTIAL_MARKER
    assert plan.exec_env()[CODEX_CREDENTIAL_ENV] == CREDENTIAL
    assert [f.path for f in plan.files] == ["/app/AGENTS.md", f"{CODEX_HOME_ROOT}/logs/agent/config.toml"]
    # Nothing stored holds the secret.
    assert CREDENTIAL not in json.dumps(plan.to_dict())

    stdin = launch_plan_build(recipe=recipe(instruction={"via": "stdin"}), bindings=BINDINGS)
    assert stdin.argv == (*CODEX_ARGV, "--ephemeral")  # no prompt argument: codex exec reads stdin
    file = launch_plan_build(
        recipe=recipe(instruction={"via": "file:TASK.md"}, args=["Read TASK.md"]), bindings=BINDINGS
    )
    assert file.argv == (*CODEX_ARGV, "Read TASK.md") and file.instruction_path == "/app/TASK.md"


def test_the_config_points_codex_at_the_bridge_with_the_route_and_no_network_features():
    plan = launch_plan_build(recipe=recipe(), bindings=BINDINGS)
    path, config = config_of(plan)
    assert path == f"{plan.env['CODEX_HOME']}/config.toml"
    provider = config["model_providers"][config["model_provider"]]
    assert provider == {
        "name": "Synth",
        "base_url": "http://127.0.0.1:8377/v1",
        "wire_api": "responses",
        "env_key": CODEX_CREDENTIAL_ENV,
        "http_headers": {TRIAL_HEADER: "trl_cx1"},
    }
    assert config["model"] == "qwen3-8b"
    assert (config["approval_policy"], config["sandbox_mode"]) == ("never", "danger-full-access")
    assert config["check_for_update_on_startup"] is False and config["web_search"] == "disabled"
    assert config["analytics"] == {"enabled": False} and config["feedback"] == {"enabled": False}
    assert config["features"] == {"plugins": False}
    assert config["model_reasoning_summary"] == "none"


def test_the_config_quotes_what_the_bindings_bring():
    odd = ModelBinding(name='q"w\\e', base_url='http://127.0.0.1:1/x"y', route="r")
    attempt = AttemptBinding(trial_id='trl_"]x', index=0)
    plan = launch_plan_build(recipe=recipe(), bindings=replace(BINDINGS, model=odd, attempt=attempt))
    _, config = config_of(plan)
    assert config["model"] == 'q"w\\e'
    assert config["model_providers"]["synth"]["base_url"] == 'http://127.0.0.1:1/x"y/v1'
    assert config["model_providers"]["synth"]["http_headers"] == {TRIAL_HEADER: 'trl_"]x'}


def test_a_judges_codex_home_is_its_own():
    actor = launch_plan_build(recipe=recipe(), bindings=BINDINGS)
    judge = launch_plan_build(recipe=recipe(), bindings=BINDINGS, logs_dir="/logs/verifier/judge")
    assert judge.env["CODEX_HOME"] == f"{CODEX_HOME_ROOT}/logs/verifier/judge" != actor.env["CODEX_HOME"]
    assert config_of(judge)[0].startswith(judge.env["CODEX_HOME"] + "/")


def test_codex_needs_a_model_and_its_credential():
    with pytest.raises(RecipeInvalid, match="model is required for engine 'codex'"):
        recipe_validate(recipe={k: v for k, v in CODEX.items() if k != "model"})
    with pytest.raises(LaunchError) as info:
        launch_plan_build(recipe=recipe(), bindings=replace(BINDINGS, credential=None))
    assert info.value.field == "bindings.credential"


@pytest.mark.parametrize(
    "args",
    [
        ["-c", 'model="gpt"'],
        ["--config=model_provider=openai"],
        ["-m", "gpt"],
        ["--model=gpt"],
        ["--profile", "fast"],
        ["-s", "read-only"],
        ["--sandbox=workspace-write"],
        ["--dangerously-bypass-approvals-and-sandbox"],
        ["--oss"],
        ["--remote", "ws://x"],
        ["--cd", "/"],
        ["--json"],
        ["--color=always"],
        ["--skip-git-repo-check"],
        ["--ignore-user-config"],
    ],
)
def test_recipe_args_the_platform_sets_are_refused(args):
    with pytest.raises(RecipeInvalid, match="reserved by the platform") as info:
        recipe_validate(recipe=recipe(args=args))
    assert info.value.field == "args[0]"


def test_recipe_args_that_are_the_agents_own_are_accepted():
    recipe_validate(
        recipe=recipe(args=["--ephemeral", "-o", "/app/last.txt", "--enable", "goals", "--output-schema", "s.json"])
    )


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"env": {"CODEX_HOME": "/root/.codex"}}, "env.CODEX_HOME"),
        ({"env": {"OPENAI_BASE_URL": "https://api.openai.com/v1"}}, "env.OPENAI_BASE_URL"),
        ({"env": {"SYNTH_MODEL_CREDENTIAL": "x"}}, "env.SYNTH_MODEL_CREDENTIAL"),
        ({"files": [{"path": ".codex/config.toml", "content": 'model = "gpt"'}]}, "files[0].path"),
    ],
)
def test_recipe_config_the_platform_writes_is_refused(changes, field):
    with pytest.raises(RecipeInvalid) as info:
        recipe_validate(recipe=recipe(**changes))
    assert info.value.field == field


def test_a_recipe_file_at_the_config_path_is_refused():
    clash = recipe(workdir=CODEX_HOME_ROOT + "/logs", files=[{"path": "agent/config.toml", "content": "x"}])
    with pytest.raises(LaunchError) as info:
        launch_plan_build(recipe=clash, bindings=BINDINGS)
    assert info.value.field == "files[0].path" and "written by the platform" in info.value.message


# ---------------------------------------------------------------- the real Codex


def _codex_executable() -> Path:
    # The native executable npm installed (package.json pins @openai/codex); the test fails,
    # rather than skips, when it is missing: CI installs node_modules with npm ci.
    from django.conf import settings

    path = Path(settings.SYNTH_CODEX_SANDBOX_BIN)
    assert path.is_file(), f"{path} is missing: run `npm ci` in the repository root"
    return path


def test_the_real_codex_reads_the_launchers_config_and_calls_only_the_bridge(tmp_path):
    recorded = tmp_path / "requests"
    recorded.mkdir()
    recorder = codex_recorder.Recorder(out=recorded, credential=CREDENTIAL)
    server = codex_recorder.serve(port=0, recorder=recorder)
    try:
        port = server.server_address[1]
        bindings = replace(
            BINDINGS,
            task=TaskBinding(name="t", workdir=str(tmp_path / "work"), instruction="write out.txt"),
            model=ModelBinding(name="qwen3-8b", base_url=f"http://127.0.0.1:{port}", route="qwen3-8b"),
        )
        plan = launch_plan_build(recipe=recipe(files=[]), bindings=bindings)
        (tmp_path / "work").mkdir()
        # On this host, not in a sandbox: the config goes to a CODEX_HOME of the test's.
        home = tmp_path / "codex-home"
        home.mkdir()
        (home / "config.toml").write_text(next(f.content for f in plan.files if f.path.endswith("/config.toml")))
        env = {**plan.exec_env(), "CODEX_HOME": str(home), "PATH": os.environ["PATH"], "HOME": str(tmp_path)}
        # --strict-config: Codex refuses a key it does not know, so every setting is real.
        argv = [str(_codex_executable()), *plan.argv[1:-2], "--strict-config", "--", plan.argv[-1]]
        out = subprocess.run(
            argv, cwd=plan.workdir, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
        )
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr[-3000:]
    requests = [json.loads(p.read_text()) for p in sorted(recorded.glob("*.json"))]
    assert [(r["method"], r["path"]) for r in requests] == [("POST", "/v1/responses")] * 2
    for r in requests:
        # The attempt's credential (from the variable the config names) and its trial.
        assert r["headers"]["authorization"] == "Bearer <the env_key credential>"
        assert r["headers"][TRIAL_HEADER] == "trl_cx1"
        assert r["body"]["model"] == "qwen3-8b" and r["body"]["stream"] is True
        assert not any(t.get("type") == "web_search" for t in r["body"]["tools"])
    assert (tmp_path / "work" / "out.txt").read_text() == "recorded\n"  # its shell tool ran
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert events[-1]["type"] == "turn.completed"
    assert [e["item"]["type"] for e in events if e["type"] == "item.completed" and e["item"]["type"] != "error"] == [
        "command_execution",
        "agent_message",
    ]
