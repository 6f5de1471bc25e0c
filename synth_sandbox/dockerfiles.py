"""A task's Dockerfile, read the way Docker reads it, as steps the local sandbox can apply.

The local sandbox has no image (the host's ``/usr``, ``/etc``, ``/opt`` stand in for the base
image), so a Dockerfile is *interpreted*: each instruction either has a faithful equivalent in
a running sandbox, has no effect on one (metadata), or is refused by name.  Refusing is the
point: a ``COPY`` that is silently dropped makes a correct solution score 0.

Syntax (line continuations, comments, the ``escape`` directive, JSON forms, heredocs) is
BuildKit's own Go parser, wrapped by the ``dockerfile`` package.  Semantics follow BuildKit's
dispatcher: global ``ARG`` s before ``FROM`` serve ``FROM`` only, ``ENV`` beats ``ARG`` in
substitution, every pair of one ``ENV`` is substituted against the state *before* it, variables
are substituted in ``ENV``, ``ARG``, ``WORKDIR``, ``COPY``/``ADD``, ``USER`` and ``FROM`` but not in
``RUN`` (the shell does that, with ``ARG`` s and ``ENV`` in its environment), and a relative
``WORKDIR`` or destination is resolved against the current ``WORKDIR``.

Pure: text in, a :class:`DockerfilePlan` out; the build context is looked at by build.py.
"""

from __future__ import annotations

import platform
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import dockerfile as buildkit_parser

# Instructions that only describe an image (how to start it, what it exposes): a sandbox that
# is already running and driven by Harbor's execs has nothing to apply for them.
IGNORED_INSTRUCTIONS = frozenset(
    {"LABEL", "EXPOSE", "MAINTAINER", "STOPSIGNAL", "HEALTHCHECK", "CMD", "ENTRYPOINT", "VOLUME"}
)
DEFAULT_SHELL = ("/bin/sh", "-c")
_TEXT_MAX = 120
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIRECTIVE = re.compile(r"^#\s*([A-Za-z][A-Za-z0-9]*)\s*=\s*(.*?)\s*$")
_URL = re.compile(r"^([a-z][a-z0-9+.-]*://|git@)", re.IGNORECASE)
_OCTAL_MODE = re.compile(r"^[0-7]{3,4}$")
_DOCKERFILE_FRONTENDS = re.compile(
    r"^(docker\.io/)?docker/dockerfile(-upstream)?(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]+)?$"
)


class SubstitutionError(ValueError):
    """A word whose variable substitution Docker would reject (or that is not supported here)."""


@dataclass(frozen=True)
class Instruction:
    """Where a step comes from: its first line and its text (continuations joined)."""

    line: int
    text: str

    def describe(self, file: str) -> str:
        return f"{file} line {self.line} ({self.text})"


@dataclass(frozen=True)
class WorkdirStep:
    at: Instruction
    path: str  # absolute


@dataclass(frozen=True)
class CopyStep:
    at: Instruction
    sources: tuple[str, ...]  # as written (substituted), relative to the build context
    dest: str  # absolute
    dest_is_dir: bool  # a trailing slash, or several sources
    chmod: int | None
    add: bool


@dataclass(frozen=True)
class RunStep:
    at: Instruction
    argv: tuple[str, ...]  # ("/bin/sh", "-c", command) for the shell form
    cwd: str
    env: tuple[tuple[str, str], ...]  # ARGs and ENV in force, ENV winning


Step = WorkdirStep | CopyStep | RunStep


@dataclass
class DockerfilePlan:
    file: str  # e.g. "environment/Dockerfile", for messages
    base_image: str | None = None
    steps: list[Step] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # ENV at the end: every process of the sandbox
    workdir: str | None = None  # the last WORKDIR (None: never set)
    refusals: list[str] = field(default_factory=list)  # one message per refused instruction
    ignored: list[Instruction] = field(default_factory=list)

    @property
    def has_run(self) -> bool:
        return any(isinstance(step, RunStep) for step in self.steps)

    def refuse(self, at: Instruction | None, problem: str) -> None:
        where = at.describe(self.file) if at is not None else self.file
        self.refusals.append(f"{where}: {problem}")

    def to_json(self) -> dict[str, Any]:
        """Everything that determines the build's result, for the build cache's key."""
        return {
            "base_image": self.base_image,
            "env": sorted(self.env.items()),
            "workdir": self.workdir,
            "steps": [_step_json(step) for step in self.steps],
        }


def _step_json(step: Step) -> dict[str, Any]:
    if isinstance(step, WorkdirStep):
        return {"workdir": step.path}
    if isinstance(step, CopyStep):
        return {
            "copy": list(step.sources),
            "dest": step.dest,
            "dest_is_dir": step.dest_is_dir,
            "chmod": step.chmod,
            "add": step.add,
        }
    return {"run": list(step.argv), "cwd": step.cwd, "env": [list(kv) for kv in step.env]}


# --------------------------------------------------------------------------- substitution


def expand_word(*, word: str, scope: Mapping[str, str], escape: str = "\\") -> str:
    """Docker's word processing: quotes removed, escapes applied, ``$VAR``, ``${VAR}``,
    ``${VAR:-x}``, ``${VAR-x}``, ``${VAR:+x}``, ``${VAR+x}``, ``${VAR:?msg}`` substituted.

    Whitespace is kept (one word in, one word out), as BuildKit's ``ProcessWord`` does.
    """
    return _Lexer(word, scope, escape).word(stop=None)


class _Lexer:
    def __init__(self, text: str, scope: Mapping[str, str], escape: str) -> None:
        self.text = text
        self.pos = 0
        self.scope = scope
        self.escape = escape

    def _next(self) -> str:
        ch = self.text[self.pos]
        self.pos += 1
        return ch

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def word(self, *, stop: str | None) -> str:
        out: list[str] = []
        while self.pos < len(self.text):
            if stop is not None and self._peek() == stop:
                return "".join(out)
            ch = self._next()
            if ch == self.escape:
                if self.pos < len(self.text):
                    out.append(self._next())
            elif ch == "'":
                out.append(self._single_quoted())
            elif ch == '"':
                out.append(self._double_quoted())
            elif ch == "$":
                out.append(self._dollar())
            else:
                out.append(ch)
        if stop is not None:
            raise SubstitutionError(f"missing '{stop}' in {self.text!r}")
        return "".join(out)

    def _single_quoted(self) -> str:
        end = self.text.find("'", self.pos)
        if end < 0:
            raise SubstitutionError(
                f"unexpected end of statement while looking for matching single-quote in {self.text!r}"
            )
        value = self.text[self.pos : end]
        self.pos = end + 1
        return value

    def _double_quoted(self) -> str:
        out: list[str] = []
        while self.pos < len(self.text):
            ch = self._next()
            if ch == '"':
                return "".join(out)
            if ch == self.escape and self._peek() in ('"', "$", self.escape):
                out.append(self._next())
            elif ch == "$":
                out.append(self._dollar())
            else:
                out.append(ch)
        raise SubstitutionError(f"unexpected end of statement while looking for matching double-quote in {self.text!r}")

    def _name(self) -> str:
        match = _NAME.match(self.text, self.pos)
        if match is None:
            return ""
        self.pos = match.end()
        return match.group()

    def _dollar(self) -> str:
        if self._peek() != "{":
            name = self._name()
            return self.scope.get(name, "") if name else "$"
        self.pos += 1
        name = self._name()
        if not name:
            raise SubstitutionError(f"bad substitution in {self.text!r}")
        ch = self._peek()
        if not ch:
            raise SubstitutionError(f"missing '}}' in {self.text!r}")
        if ch == "}":
            self.pos += 1
            return self.scope.get(name, "")
        if ch == ":" and self.text[self.pos + 1 : self.pos + 2] in ("-", "+", "?"):
            modifier = self.text[self.pos : self.pos + 2]
        elif ch in "-+?":
            modifier = ch
        else:
            raise SubstitutionError(
                f"${{{name}{self.text[self.pos : self.pos + 1]}...}} in {self.text!r}: only the modifiers "
                ":-, -, :+, +, :? and ? are supported"
            )
        self.pos += len(modifier)
        alternative = self.word(stop="}")
        self.pos += 1
        return self._modified(name, modifier, alternative)

    def _modified(self, name: str, modifier: str, alternative: str) -> str:
        is_set = name in self.scope
        value = self.scope.get(name, "")
        present = bool(value) if modifier.startswith(":") else is_set
        if modifier.endswith("-"):
            return value if present else alternative
        if modifier.endswith("+"):
            return alternative if present else ""
        if not present:
            raise SubstitutionError(f"{name}: {alternative or 'parameter not set'}")
        return value


# --------------------------------------------------------------------------- interpretation


def platform_args() -> dict[str, str]:
    """BuildKit's automatic platform ARGs, for this host (the only platform it can provide)."""
    arch = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(platform.machine(), platform.machine())
    values = {"PLATFORM": f"linux/{arch}", "OS": "linux", "ARCH": arch, "VARIANT": ""}
    return {f"{side}{key}": value for side in ("BUILD", "TARGET") for key, value in values.items()}


def parser_directives(*, text: str) -> dict[str, str]:
    """The directives at the top of a Dockerfile (``# syntax=...``, ``# escape=...``)."""
    found: dict[str, str] = {}
    for line in text.lstrip("\ufeff").splitlines():
        match = _DIRECTIVE.match(line.strip())
        if match is None or match.group(1).lower() in found:
            break
        found[match.group(1).lower()] = match.group(2)
    return found


def dockerfile_plan(
    *, text: str, file: str = "Dockerfile", base_env: Mapping[str, str] | None = None
) -> DockerfilePlan:
    """Interpret a Dockerfile; what cannot be applied faithfully is in ``plan.refusals``."""
    plan = DockerfilePlan(file=file)
    directives = parser_directives(text=text)
    escape = directives.get("escape", "\\") or "\\"
    syntax = directives.get("syntax")
    if syntax and not _DOCKERFILE_FRONTENDS.match(syntax):
        plan.refuse(None, f"# syntax={syntax} selects another build frontend, whose semantics are unknown here")
    try:
        commands = buildkit_parser.parse_string(text)
    except buildkit_parser.GoParseError as exc:
        plan.refuse(None, f"cannot be parsed: {exc}")
        return plan
    _Interpreter(plan, escape=escape, base_env=base_env or {}).run(commands)
    return plan


class _Interpreter:
    def __init__(self, plan: DockerfilePlan, *, escape: str, base_env: Mapping[str, str]) -> None:
        self.plan = plan
        self.escape = escape
        self.base_env = dict(base_env)
        self.global_args: dict[str, str | None] = {}
        self.stage_args: dict[str, str | None] = {}
        self.workdir = "/"
        self.stages = 0

    # The scope of substitution: ARGs with a value, then the image's environment (the base
    # image's, then ENV), which wins.
    def scope(self) -> dict[str, str]:
        if not self.stages:
            args = {**platform_args(), **self.global_args}
            return {k: v for k, v in args.items() if v is not None}
        stage_args = {k: v for k, v in self.stage_args.items() if v is not None}
        return {**stage_args, **self.base_env, **self.plan.env}

    def expand(self, word: str) -> str:
        return expand_word(word=word, scope=self.scope(), escape=self.escape)

    def run(self, commands: Any) -> None:
        for command in commands:
            at = Instruction(line=command.start_line, text=_short(command.original))
            try:
                self.dispatch(command, at)
            except SubstitutionError as exc:
                self.plan.refuse(at, str(exc))
        if not self.stages:
            self.plan.refuse(None, "has no FROM instruction")

    def dispatch(self, command: Any, at: Instruction) -> None:
        name = command.cmd.upper()
        if name not in _KNOWN:
            self.plan.refuse(at, f"unknown instruction {name}")
            return
        if command.heredocs:
            self.plan.refuse(at, "heredocs (<<EOF) are not applied by the local sandbox")
            return
        if not any(str(v).strip() for v in command.value):
            self.plan.refuse(at, f"{name} has no arguments")
            return
        if name == "ARG":
            self.arg(command.value)
            return
        if name == "FROM":
            self.from_(command, at)
            return
        if not self.stages:
            self.plan.refuse(at, f"{name} before FROM")
            return
        handler = _HANDLERS.get(name)
        if handler is not None:
            handler(self, command, at)
        elif name in IGNORED_INSTRUCTIONS:
            self.plan.ignored.append(at)
        else:  # SHELL, ONBUILD
            self.plan.refuse(at, "not applied by the local sandbox")

    def from_(self, command: Any, at: Instruction) -> None:
        if self.stages:
            self.plan.refuse(at, "multi-stage builds (more than one FROM) are not applied by the local sandbox")
            return
        flags = _flags(command.flags)
        image = self.expand(command.value[0]) if command.value else ""  # global ARGs only
        self.stages += 1
        platform_flag = flags.pop("platform", None)
        if platform_flag is not None and self.expand(platform_flag) != platform_args()["TARGETPLATFORM"]:
            self.plan.refuse(
                at, f"--platform={platform_flag}: this host only provides {platform_args()['TARGETPLATFORM']}"
            )
        for flag in flags:
            self.plan.refuse(at, f"FROM --{flag} is not applied by the local sandbox")
        if not image:
            self.plan.refuse(at, "names no image")
        self.plan.base_image = image or None

    def arg(self, tokens: Any) -> None:
        target = self.stage_args if self.stages else self.global_args
        for token in tokens:
            name, has_default, default = str(token).partition("=")
            if has_default:
                target[name] = self.expand(default)
            elif self.stages and name in {**platform_args(), **self.global_args}:
                # A global ARG (or an automatic platform one) redeclared in the stage.
                target[name] = {**platform_args(), **self.global_args}[name]
            else:
                target.setdefault(name, None)

    def env(self, command: Any, at: Instruction) -> None:
        values = list(command.value)
        pairs = [(self.expand(values[i]), self.expand(values[i + 1])) for i in range(0, len(values) - 1, 2)]
        for key, value in pairs:
            self.plan.env[key] = value

    def workdir_(self, command: Any, at: Instruction) -> None:
        path = self.expand(command.value[0]) if command.value else ""
        if not path:
            self.plan.refuse(at, "WORKDIR needs a path")
            return
        self.workdir = posixpath.normpath(posixpath.join(self.workdir, path))
        self.plan.workdir = self.workdir
        self.plan.steps.append(WorkdirStep(at=at, path=self.workdir))

    def user(self, command: Any, at: Instruction) -> None:
        user = self.expand(command.value[0]) if command.value else ""
        name, _, group = user.partition(":")
        if name not in ("root", "0") or group not in ("", "root", "0"):
            self.plan.refuse(
                at,
                f"only root can be the user (the sandbox maps a single uid, so the permissions of {user!r} "
                "cannot be reproduced)",
            )

    def copy(self, command: Any, at: Instruction) -> None:
        add = command.cmd.upper() == "ADD"
        flags = _flags(command.flags)
        if "from" in flags:
            self.plan.refuse(at, f"COPY --from={flags['from']} (multi-stage) is not applied by the local sandbox")
            return
        chmod = self._chmod(flags.pop("chmod", None), at)
        flags.pop("chown", None)  # everything is root inside: nothing to change
        flags.pop("link", None)  # a layer-caching hint
        for flag in flags:
            self.plan.refuse(at, f"{command.cmd.upper()} --{flag} is not applied by the local sandbox")
        parts = [self.expand(str(p)) for p in command.value]
        if len(parts) < 2:
            self.plan.refuse(at, f"{command.cmd.upper()} needs at least one source and a destination")
            return
        *sources, dest = parts
        urls = [s for s in sources if _URL.match(s)]
        if urls:
            self.plan.refuse(
                at, f"{command.cmd.upper()} of a URL ({urls[0]}) is not applied (the sandbox has no network)"
            )
            return
        dest_is_dir = dest.endswith("/") or dest.endswith("/.") or dest == "." or len(sources) > 1
        resolved = posixpath.normpath(posixpath.join(self.workdir, dest))
        step = CopyStep(at=at, sources=tuple(sources), dest=resolved, dest_is_dir=dest_is_dir, chmod=chmod, add=add)
        self.plan.steps.append(step)

    def _chmod(self, value: str | None, at: Instruction) -> int | None:
        if value is None:
            return None
        if not _OCTAL_MODE.match(value):
            self.plan.refuse(at, f"--chmod={value}: only octal modes are applied")
            return None
        return int(value, 8)

    def run_(self, command: Any, at: Instruction) -> None:
        flags = _flags(command.flags)
        network = flags.pop("network", "default")
        if network not in ("none", "default"):
            self.plan.refuse(at, f"RUN --network={network} is not applied (the sandbox has no network)")
        for flag in flags:
            self.plan.refuse(at, f"RUN --{flag} is not applied by the local sandbox")
        if command.json:
            argv = tuple(str(v) for v in command.value)
        else:
            argv = (*DEFAULT_SHELL, str(command.value[0]) if command.value else "")
        if not argv or not argv[-1]:
            self.plan.refuse(at, "RUN needs a command")
            return
        env = self.scope()
        self.plan.steps.append(RunStep(at=at, argv=argv, cwd=self.workdir, env=tuple(sorted(env.items()))))


_HANDLERS = {
    "ENV": _Interpreter.env,
    "WORKDIR": _Interpreter.workdir_,
    "USER": _Interpreter.user,
    "COPY": _Interpreter.copy,
    "ADD": _Interpreter.copy,
    "RUN": _Interpreter.run_,
}


_KNOWN = frozenset({"ARG", "FROM", "SHELL", "ONBUILD", *_HANDLERS, *IGNORED_INSTRUCTIONS})


def _flags(raw: Any) -> dict[str, str]:
    """("--chmod=755", "--link") -> {"chmod": "755", "link": ""} (the last of a repeated flag wins,
    except --mount, which is refused anyway)."""
    out: dict[str, str] = {}
    for flag in raw:
        name, _, value = str(flag).removeprefix("--").partition("=")
        out[name.lower()] = value
    return out


def _short(original: str) -> str:
    text = " ".join(original.split("\n", 1)[0].split())
    return text if len(text) <= _TEXT_MAX else text[: _TEXT_MAX - 3] + "..."
