"""Dockerfile interpretation (no sandbox): syntax, substitution, steps, refusals, the build
context (.dockerignore, sources) and the checks made before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from synth_sandbox.build import BuildContext, BuildContextError, IgnoreRules, prepare_build
from synth_sandbox.dockerfiles import (
    CopyStep,
    RunStep,
    SubstitutionError,
    WorkdirStep,
    dockerfile_plan,
    expand_word,
)
from synth_sandbox.paths import DEFAULT_HOST_DIRS, DEFAULT_WRITABLE_DIRS


def plan_of(text: str):  # type: ignore[no-untyped-def]
    return dockerfile_plan(text=text, file="environment/Dockerfile", base_env={"PATH": "/usr/bin:/bin"})


# --------------------------------------------------------------------------- syntax


def test_continuations_comments_and_line_numbers() -> None:
    plan = plan_of(
        "# a comment\n"
        "FROM ubuntu:24.04\n"
        "\n"
        "RUN echo one \\\n"
        "  # a comment inside a continuation is dropped\n"
        "  && echo two\n"
        "WORKDIR /app\n"
    )
    assert plan.refusals == [] and plan.base_image == "ubuntu:24.04"
    run, workdir = plan.steps
    assert isinstance(run, RunStep) and run.at.line == 4
    assert run.argv[:2] == ("/bin/sh", "-c") and run.argv[2].split() == ["echo", "one", "&&", "echo", "two"]
    assert isinstance(workdir, WorkdirStep) and workdir.at.line == 7 and workdir.path == "/app"


def test_exec_form_is_not_substituted_and_shell_form_is_left_to_the_shell() -> None:
    plan = plan_of('FROM debian\nARG V=1\nRUN ["python3", "-c", "print(\'$V\')"]\nRUN echo "$V" > /app/v\n')
    exec_form, shell_form = plan.steps
    assert isinstance(exec_form, RunStep) and exec_form.argv == ("python3", "-c", "print('$V')")
    assert isinstance(shell_form, RunStep) and shell_form.argv == ("/bin/sh", "-c", 'echo "$V" > /app/v')
    # The shell sees ARGs and ENV in its environment.
    assert ("V", "1") in shell_form.env and ("PATH", "/usr/bin:/bin") in shell_form.env


def test_escape_directive_changes_the_continuation_and_escape_character() -> None:
    plan = plan_of("# escape=`\nFROM ubuntu\nENV A=x`$y B=c:\\dir\nRUN echo one `\n  two\n")
    assert plan.env == {"A": "x$y", "B": "c:\\dir"}
    assert isinstance(plan.steps[0], RunStep) and plan.steps[0].argv[2].split() == ["echo", "one", "two"]


def test_a_syntax_directive_for_another_frontend_is_refused() -> None:
    assert plan_of("# syntax=docker/dockerfile:1.7\nFROM ubuntu\n").refusals == []
    [refusal] = plan_of("# syntax=example.org/other-frontend\nFROM ubuntu\n").refusals
    assert "another build frontend" in refusal


# --------------------------------------------------------------------------- substitution


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("$A", "a"),
        ("${A}x", "ax"),
        ("${UNSET}", ""),
        ("${UNSET:-dflt}", "dflt"),
        ("${EMPTY:-dflt}", "dflt"),
        ("${EMPTY-dflt}", ""),
        ("${A:+alt}", "alt"),
        ("${EMPTY:+alt}", ""),
        ("${EMPTY+alt}", "alt"),
        ("${UNSET:-$A-${A}}", "a-a"),
        ("'$A'", "$A"),
        ('"$A b"', "a b"),
        ('"\\"q\\" \\$A"', '"q" $A'),
        ("\\$A", "$A"),
        ("a\\ b", "a b"),
        ("$", "$"),
        ("x$-", "x$-"),
        ('"two  spaces"', "two  spaces"),
    ],
)
def test_substitution(word: str, expected: str) -> None:
    assert expand_word(word=word, scope={"A": "a", "EMPTY": ""}) == expected


@pytest.mark.parametrize(
    ("word", "message"),
    [
        ("'open", "single-quote"),
        ('"open', "double-quote"),
        ("${A", "missing '}'"),
        ("${A%%.*}", "only the modifiers"),
        ("${UNSET:?must be set}", "must be set"),
        ("${}", "bad substitution"),
    ],
)
def test_substitution_errors(word: str, message: str) -> None:
    with pytest.raises(SubstitutionError, match=message.replace("(", r"\(")):
        expand_word(word=word, scope={"A": "a"})


def test_arg_and_env_scopes_follow_docker() -> None:
    plan = plan_of(
        "ARG BASE=ubuntu:24.04\n"
        "ARG TAG\n"
        "FROM ${BASE}\n"
        "ARG BASE\n"  # a global ARG comes into the stage only when redeclared
        "ARG WHO=world\n"
        'ENV GREETING="hello $WHO" FIRST=$GREETING\n'  # pairs see the state before the instruction
        "ENV WHO=env PATH=/opt/tool/bin:$PATH\n"
        "ENV OLD value with  spaces\n"
        "ENV FROM_BASE=$BASE ARCH=$TARGETARCH\n"
        "RUN true\n"
    )
    assert plan.base_image == "ubuntu:24.04" and plan.refusals == []
    assert plan.env["GREETING"] == "hello world" and plan.env["FIRST"] == ""
    assert plan.env["PATH"] == "/opt/tool/bin:/usr/bin:/bin"
    assert plan.env["OLD"] == "value with  spaces" and plan.env["FROM_BASE"] == "ubuntu:24.04"
    assert plan.env["ARCH"] == ""  # platform ARGs too need declaring in the stage
    run = plan.steps[0]
    assert isinstance(run, RunStep) and dict(run.env)["WHO"] == "env"  # ENV beats ARG
    assert "WHO" in plan.env and "BASE" not in plan.env  # ARGs do not reach the running sandbox


def test_workdir_and_destinations_resolve_like_docker() -> None:
    plan = plan_of(
        "FROM ubuntu\n"
        "COPY a.txt rel/\n"
        "WORKDIR /srv\n"
        "WORKDIR app/../work\n"
        "COPY --chmod=0640 --chown=app:app a.txt b.txt ./\n"
        "COPY a.txt data.txt\n"
        'COPY ["with space.txt", "/data/"]\n'
        "ENV DEST=/opt2\n"
        "ADD --link pkg.tar.gz $DEST/\n"
    )
    assert plan.refusals == [] and plan.workdir == "/srv/work"
    c1, w1, w2, c2, c3, c4, add = plan.steps
    assert isinstance(c1, CopyStep) and c1.dest == "/rel" and c1.dest_is_dir
    assert isinstance(w1, WorkdirStep) and isinstance(w2, WorkdirStep) and w2.path == "/srv/work"
    assert isinstance(c2, CopyStep) and c2.dest == "/srv/work" and c2.dest_is_dir and c2.chmod == 0o640
    assert isinstance(c3, CopyStep) and c3.dest == "/srv/work/data.txt" and not c3.dest_is_dir
    assert isinstance(c4, CopyStep) and c4.sources == ("with space.txt",) and c4.dest == "/data"
    assert isinstance(add, CopyStep) and add.add and add.dest == "/opt2"


def test_metadata_is_ignored_and_root_user_applied() -> None:
    plan = plan_of(
        "FROM ubuntu\nLABEL a=b\nEXPOSE 80\nMAINTAINER x\nSTOPSIGNAL SIGTERM\nHEALTHCHECK CMD true\n"
        'CMD ["bash"]\nENTRYPOINT ["/x"]\nVOLUME /data\nUSER root\nUSER 0:0\n'
    )
    assert plan.refusals == [] and plan.steps == []
    assert [i.text.split()[0] for i in plan.ignored] == [
        "LABEL",
        "EXPOSE",
        "MAINTAINER",
        "STOPSIGNAL",
        "HEALTHCHECK",
        "CMD",
        "ENTRYPOINT",
        "VOLUME",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("FROM ubuntu\nUSER app\n", "line 2 (USER app): only root can be the user"),
        ("FROM ubuntu\nARG U=1000\nUSER $U\n", "line 3 (USER $U): only root can be the user"),
        ('FROM ubuntu\nSHELL ["/bin/bash", "-c"]\n', "line 2 (SHELL"),
        ("FROM ubuntu\nONBUILD RUN x\n", "line 2 (ONBUILD RUN x): not applied"),
        ("FROM ubuntu\nADD https://example.org/a.tgz /a/\n", "ADD of a URL"),
        ("FROM ubuntu\nCOPY --from=build /a /a\n", "COPY --from=build (multi-stage)"),
        ("FROM ubuntu AS build\nRUN true\nFROM ubuntu\n", "line 3 (FROM ubuntu): multi-stage builds"),
        ("FROM ubuntu\nRUN <<EOF\necho hi\nEOF\n", "line 2 (RUN <<EOF): heredocs"),
        ("FROM ubuntu\nCOPY <<EOF /a\nx\nEOF\n", "heredocs"),
        ("FROM ubuntu\nRUN --mount=type=cache,target=/c true\n", "RUN --mount is not applied"),
        ("FROM ubuntu\nRUN --network=host true\n", "RUN --network=host"),
        ("FROM ubuntu\nCOPY --chmod=u+x a /a\n", "only octal modes"),
        ("FROM ubuntu\nCOPY --parents a /a/\n", "COPY --parents is not applied"),
        ("FROM ubuntu\nFROBNICATE x\n", "unknown instruction FROBNICATE"),
        ("RUN true\nFROM ubuntu\n", "line 1 (RUN true): RUN before FROM"),
        ("ARG X=1\n", "has no FROM"),
        ('FROM ubuntu\nENV A="${B:?B is required}"\n', 'line 2 (ENV A="${B:?B is required}"): B: B is required'),
        ("FROM ubuntu\nENV A=1 B\n", "cannot be parsed: Syntax error"),
        ("FROM --platform=linux/s390x ubuntu\n", "--platform=linux/s390x"),
        ("FROM ubuntu\nENV\n", "line 2 (ENV): ENV has no arguments"),
        ("FROM ubuntu\nWORKDIR\n", "line 2 (WORKDIR): WORKDIR has no arguments"),
    ],
)
def test_refusals_name_the_instruction(text: str, expected: str) -> None:
    refusals = plan_of(text).refusals
    assert any(expected in r for r in refusals), refusals
    assert all(r.startswith("environment/Dockerfile") for r in refusals)


# --------------------------------------------------------------------------- build context


def test_dockerignore_rules() -> None:
    rules = IgnoreRules.parse(
        "# comment\n*.log\n/build\n**/secret*\n!keep.log\ndocs\n!docs/README.md\nsub/*.tmp\n\\#literal\n"
    )
    assert rules.excluded("a.log") and not rules.excluded("dir/a.log")  # "*" stays at the top
    assert not rules.excluded("keep.log")
    assert rules.excluded("build") and rules.excluded("build/out/x")  # a parent matches
    assert rules.excluded("secret.txt") and rules.excluded("deep/er/secret.key")
    assert rules.excluded("docs/a.md") and not rules.excluded("docs/README.md")
    assert rules.excluded("sub/x.tmp") and not rules.excluded("sub/deeper/x.tmp")
    assert rules.excluded("#literal") and not rules.excluded("main.py")


@pytest.fixture
def context_dir(tmp_path: Path) -> Path:
    root = tmp_path / "environment"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "src" / "main.py").write_text("print(1)\n")
    (root / "a.txt").write_text("a\n")
    (root / "b.txt").write_text("b\n")
    (root / "debug.log").write_text("log\n")
    (root / "link.txt").symlink_to("a.txt")
    (root / ".dockerignore").write_text("*.log\n")
    return root


def test_sources_globs_and_exclusions(context_dir: Path) -> None:
    context = BuildContext(context_dir)
    assert context.resolve("*.txt") == ["a.txt", "b.txt", "link.txt"]
    assert context.resolve("src/*.py") == ["src/main.py"]  # "*" does not cross "/"
    assert context.resolve("/a.txt") == ["a.txt"]  # "/" is the context's root
    assert context.resolve(".") == [""] and context.resolve("./src/../src") == ["src"]
    assert context.followed("link.txt") == ("a.txt", "file")
    with pytest.raises(BuildContextError, match="excluded by .dockerignore"):
        context.resolve("debug.log")
    with pytest.raises(BuildContextError, match="not found in the build context"):
        context.resolve("missing.txt")
    with pytest.raises(BuildContextError, match="no file in the build context matches"):
        context.resolve("*.md")
    with pytest.raises(BuildContextError, match="outside the build context"):
        context.resolve("../task.toml")


def test_checks_before_start_name_the_instruction(context_dir: Path) -> None:
    (context_dir / "Dockerfile").write_text(
        "FROM ubuntu\n"
        "WORKDIR /srv/app\n"
        "COPY src/ ./\n"
        "COPY a.txt /data/a.txt\n"
        "COPY b.txt /var/lib/b/\n"
        "COPY a.txt /usr/local/bin/a\n"
        "COPY missing.txt /app/\n"
        "COPY ../outside /app/\n"
        "COPY a.txt /proc/x\n"
        "WORKDIR /usr/share\n"  # exists read-only on the host: nothing to create
        "WORKDIR /etc/nothere\n"
    )
    build = prepare_build(environment_dir=context_dir, writable_dirs=DEFAULT_WRITABLE_DIRS, host_dirs=DEFAULT_HOST_DIRS)
    assert build is not None
    assert build.writable_dirs == ["/srv", "/data", "/var", "/app"]
    problems = "\n".join(build.problems)
    assert "line 6 (COPY a.txt /usr/local/bin/a): cannot write /usr/local/bin/a: " in problems
    assert "inside the host's read-only /usr" in problems
    assert "line 7 (COPY missing.txt /app/): missing.txt: not found in the build context" in problems
    assert "line 8 (COPY ../outside /app/): ../outside: outside the build context" in problems
    assert "line 9 (COPY a.txt /proc/x): cannot write /proc/x" in problems
    assert "line 11 (WORKDIR /etc/nothere)" in problems and "/usr/share" not in problems
    assert len(build.problems) == 5


def test_no_dockerfile_no_build(tmp_path: Path) -> None:
    assert (
        prepare_build(environment_dir=tmp_path, writable_dirs=DEFAULT_WRITABLE_DIRS, host_dirs=DEFAULT_HOST_DIRS)
        is None
    )


def test_a_file_cannot_be_created_at_the_top_level(context_dir: Path) -> None:
    (context_dir / "Dockerfile").write_text(
        "FROM ubuntu\nCOPY a.txt /config\nCOPY a.txt /tmp\nCOPY src /code\nWORKDIR /srv\nCOPY a.txt /srv\n"
    )
    build = prepare_build(environment_dir=context_dir, writable_dirs=DEFAULT_WRITABLE_DIRS, host_dirs=DEFAULT_HOST_DIRS)
    assert build is not None
    # /tmp and /srv are directories (as in the image), and a directory's contents can go to /code.
    assert build.problems == [
        "environment/Dockerfile line 2 (COPY a.txt /config): cannot create the file /config at the top level "
        "(the sandbox's root is read-only); copy it into a directory, e.g. /config/ or /app/"
    ]
