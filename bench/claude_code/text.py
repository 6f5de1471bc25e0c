"""Text generated from a seeded RNG and the prose pools: identifiers, paths, Python-looking
source, padded tool descriptions, the system blocks and the memory reminder."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

from bench.claude_code.prose import (
    GUIDELINES,
    MODULES,
    PACKAGES,
    PROJECT,
    REASONING,
    SYSTEM_CORE,
    TEXT_LINES,
    TYPES,
    WORDS,
)
from bench.claude_code.tools import TOOLS


def ident(rng: random.Random, parts: int = 2) -> str:
    return "_".join(rng.choice(WORDS) for _ in range(parts))


def camel(rng: random.Random) -> str:
    return "".join(rng.choice(WORDS).capitalize() for _ in range(2))


def source_file(rng: random.Random) -> str:
    return f"{PROJECT}/src/{rng.choice(PACKAGES)}/{ident(rng)}.py"


def sentence(rng: random.Random, pool: list[str]) -> str:
    return rng.choice(pool).format(
        fn=ident(rng) + "()", file=source_file(rng).rsplit("/", 1)[1], n=rng.randint(12, 480)
    )


def code_lines(rng: random.Random, count: int) -> list[str]:
    """Python-looking source (imports, classes, functions with bodies)."""
    lines = ['"""' + sentence(rng, REASONING).rstrip(".") + '."""', "", "from __future__ import annotations", ""]
    for mod in rng.sample(MODULES, 4):
        lines.append(f"import {mod}")
    lines += ["from typing import Any", "", f"from {rng.choice(PACKAGES)}.{ident(rng, 1)} import {camel(rng)}", ""]
    while len(lines) < count:
        if rng.random() < 0.2:
            lines += [
                "",
                "",
                f"class {camel(rng)}({rng.choice(['object', camel(rng), 'Exception'])}):",
                f'    """{rng.choice(GUIDELINES)}"""',
                "",
            ]
            indent = "    "
        else:
            indent = ""
        name = ident(rng)
        args = ", ".join(f"{ident(rng, 1)}: {rng.choice(TYPES)}" for _ in range(rng.randint(0, 3)))
        lines.append(f"{indent}def {name}({'self, ' if indent else ''}{args}) -> {rng.choice(TYPES)}:")
        lines.append(f'{indent}    """{sentence(rng, REASONING)}"""')
        for _ in range(rng.randint(3, 12)):
            kind = rng.random()
            var = ident(rng, 1)
            if kind < 0.35:
                lines.append(
                    f"{indent}    {var} = {ident(rng)}({ident(rng, 1)}, {ident(rng, 1)}={rng.randint(0, 100)})"
                )
            elif kind < 0.5:
                lines += [
                    f"{indent}    if {var} is None:",
                    f"{indent}        return {rng.choice(['None', '[]', '{}', '0', 'False'])}",
                ]
            elif kind < 0.65:
                lines += [f"{indent}    for {var} in {ident(rng)}:", f"{indent}        {ident(rng, 1)}.append({var})"]
            elif kind < 0.75:
                lines.append(f"{indent}    # {rng.choice(GUIDELINES)}")
            elif kind < 0.85:
                lines.append(f'{indent}    logger.info("{ident(rng)} %s took %.1f ms", {var}, elapsed * 1000)')
            else:
                lines.append(
                    f'{indent}    {var}["{ident(rng, 1)}"] = {ident(rng, 1)}.get("{ident(rng, 1)}", {rng.randint(1, 9)})'
                )
        lines.append(f"{indent}    return {ident(rng, 1)}")
        lines.append("")
    return lines[:count]


def cat_n(lines: list[str], start: int = 1) -> str:
    return "\n".join(f"{i:>6}\t{line}" for i, line in enumerate(lines, start))


def pad(text: str, target: int, rng: random.Random, header: str = "\n\nUsage notes:") -> str:
    """Append guideline bullets (each once, in a seeded order) until `text` is `target` bytes."""
    if len(text) >= target:
        return text
    order = list(GUIDELINES)
    rng.shuffle(order)
    out = [text, header]
    size = len(text) + len(header)
    round_ = 0
    while size < target:
        for sentence in order:
            line = f"\n- {sentence}" if round_ == 0 else f"\n- ({round_ + 1}) {sentence}"
            out.append(line)
            size += len(line)
            if size >= target:
                break
        round_ += 1
    return "".join(out)


def _todo_examples(rng: random.Random, count: int) -> str:
    out = []
    for _ in range(count):
        area = rng.choice(PACKAGES)
        steps = [
            f"{verb} the {ident(rng)} {noun} in the {area} package"
            for verb, noun in rng.sample(
                [
                    ("Add", "option"),
                    ("Fix", "handling"),
                    ("Rename", "field"),
                    ("Test", "path"),
                    ("Document", "behaviour"),
                    ("Remove", "fallback"),
                    ("Cache", "lookup"),
                ],
                4,
            )
        ]
        todo = "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))
        out.append(
            f"<example>\nUser: Please {steps[0][0].lower() + steps[0][1:]} and make sure the tests still pass.\n"
            f"Assistant: I'll plan this with the task list:\n{todo}\n"
            f"<reasoning>\nThe request has several steps that depend on each other ({len(steps)} here), "
            f"and the user asked for tests to pass, which is a step of its own.\n</reasoning>\n</example>"
        )
    return "\n\n## Examples\n\n" + "\n\n".join(out)


def _bash_examples(rng: random.Random, count: int) -> str:
    commands = [
        ("pytest -q {p}/tests/test_{a}.py", "Run the {a} tests"),
        ("git status && git diff --stat", "Show working tree status"),
        ("git log --oneline -n 20", "Show recent commits"),
        ("npm run build -- --filter {a}", "Build the {a} package"),
        ("python -m {a} --check", "Check the {a} module"),
        ("make -C {p} lint", "Run the linters"),
        ("docker compose logs --tail 200 {a}", "Show the {a} service logs"),
        ("ruff check {p}/src/{a}", "Lint the {a} sources"),
    ]
    out = []
    for _ in range(count):
        cmd, desc = rng.choice(commands)
        a = ident(rng, 1)
        out.append(f"- command: {cmd.format(p=PROJECT, a=a)}\n  description: {desc.format(a=a)}")
    return "\n\nExamples of good commands with descriptions:\n" + "\n".join(out)


def tool_definitions(
    *, total_bytes: int = 62_500, names: tuple[str, ...] | None = None, seed: int = 7
) -> list[dict[str, Any]]:
    """Tool definitions whose JSON totals about `total_bytes` (sizes split by weight)."""
    chosen = [t for t in TOOLS if names is None or t[0] in names]
    schema_bytes = sum(len(json.dumps({"name": t[0], "description": "", "input_schema": t[3]})) + 2 for t in chosen)
    budget = max(0, total_bytes - schema_bytes)
    weight = sum(t[2] for t in chosen)
    out = []
    for name, core, w, schema in chosen:
        rng = random.Random(f"{seed}:{name}")
        target = int(budget * w / weight)
        text = core
        if name == "TodoWrite":
            text += _todo_examples(rng, max(1, (target - len(text)) // 900))
        elif name == "Bash":
            text += _bash_examples(rng, max(1, (target - len(text)) // 400))
        out.append({"name": name, "description": pad(text, target, rng), "input_schema": copy.deepcopy(schema)})
    return out


def system_blocks(*, total_bytes: int = 6_000, seed: int = 11) -> list[dict[str, Any]]:
    """Three text blocks (identity, instructions, environment) of about `total_bytes`."""
    rng = random.Random(seed)
    identity = "You are an interactive command-line coding agent, running on a developer's machine."
    env = (
        "Here is useful information about the environment you are running in:\n<env>\n"
        f"Working directory: {PROJECT}\nIs directory a git repo: Yes\nPlatform: linux\n"
        "OS Version: Linux 6.1.0-bench\nToday's date: 2025-10-21\n</env>\n"
        "You are powered by the model named Sonnet 4.5.\n\n"
        "gitStatus: This is the git status at the start of the conversation. It will not update.\n"
        "Current branch: fix/session-cache\n\nMain branch (you will usually use this for PRs): main\n\n"
        "Status:\nM src/core/session_cache.py\nM tests/test_session_cache.py\n?? notes.txt\n\n"
        "Recent commits:\n" + "\n".join(f"{rng.getrandbits(28):07x} {rng.choice(TEXT_LINES)}" for _ in range(5))
    )
    instructions = pad(
        SYSTEM_CORE, max(len(SYSTEM_CORE), total_bytes - len(identity) - len(env)), rng, header="\n# Further guidance"
    )
    return [
        {"type": "text", "text": identity, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": instructions, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": env},
    ]


def memory_reminder(rng: random.Random, *, total_bytes: int) -> str:
    """The <system-reminder> with the project's memory file (CLAUDE.md-like) of the first user turn."""
    head = (
        "<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
        f"# claudeMd\nContents of {PROJECT}/CLAUDE.md (project instructions, checked into the codebase):\n\n"
        "# Project guide\n\n## Layout\n"
        + "\n".join(f"- src/{p}/: the {p} service ({rng.choice(GUIDELINES).lower()})" for p in PACKAGES)
        + "\n\n## Commands\n- make test: the whole suite\n- make lint: ruff and mypy\n- make dev: a local server on :8000\n"
    )
    tail = "\n\nIMPORTANT: this context may or may not be relevant to your tasks.\n</system-reminder>"
    return pad(head, max(len(head), total_bytes - len(tail)), rng, header="\n## Conventions") + tail
