"""task.toml -> Harbor's TaskConfig, with problems reported as "<file>: line N: <what>".

Validation is Harbor's own model (so whatever Harbor accepts at run time is what we accept
at import time); this module turns pydantic's locations into TOML lines and adds the bounds
the database needs (finite, positive, 32-bit sizes).
"""

from __future__ import annotations

import math
import re
import tomllib
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import ValidationError

from apps.datasets.errors import TaskFormatError

_TOML_POS = re.compile(r"^(?P<msg>.*?)\s*\(at line (?P<line>\d+), column (?P<col>\d+)\)$")
_TOML_HEADER = re.compile(r"^\s*\[\[?\s*(?P<name>[^\]]+?)\s*\]\]?\s*(#.*)?$")
_TOML_KEY = re.compile(r"""^\s*(?P<key>[A-Za-z0-9_\-]+|"[^"]*"|'[^']*')\s*=""")


def _toml_key_line(text: str, path: tuple[str, ...]) -> int | None:
    """Best-effort line number of the key at `path` ("environment", "cpus") in TOML text.

    Pydantic reports a location in the parsed data, not in the file; users want a line.
    Only `[table]` headers and bare or quoted keys are recognised, which covers task.toml
    as Harbor documents it; anything else falls back to the enclosing table, or no line.
    """
    if not path:
        return None
    lines = text.splitlines()
    table, key = ".".join(path[:-1]), path[-1]
    current = ""
    for number, line in enumerate(lines, start=1):
        header = _TOML_HEADER.match(line)
        if header:
            current = ".".join(part.strip().strip("\"'") for part in header["name"].split("."))
            if current == ".".join(path):
                return number
            continue
        match = _TOML_KEY.match(line)
        if match and current == table and match["key"].strip("\"'") == key:
            return number
    return _toml_key_line(text, path[:-1])


def _data_path(data: Any, loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Split a pydantic loc into (the part that exists in the input, the rest).

    For a union field pydantic appends the member it tried (`cpus.int`, `cpus.float`);
    those tags are not keys of the input and are reported as "expected int or float".
    """
    real: list[Any] = []
    node = data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            return tuple(real), tuple(loc[i:])
        real.append(part)
    return tuple(real), ()


def loc_format(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def pydantic_problems(exc: ValidationError, data: Any) -> list[tuple[tuple[Any, ...], str]]:
    """(input location, message) pairs, one per offending input value, in order."""
    grouped: dict[tuple[Any, ...], list[tuple[tuple[Any, ...], dict[str, Any]]]] = {}
    for error in exc.errors():
        real, rest = _data_path(data, tuple(error["loc"]))
        grouped.setdefault(real, []).append((rest, error))
    problems: list[tuple[tuple[Any, ...], str]] = []
    for real, errors in grouped.items():
        rest, first = errors[0]
        value = first.get("input")
        got = f" (got {value!r})" if isinstance(value, (str, int, float, bool)) else ""
        if first["type"] == "missing":
            # The missing key is not in the input, so it is in `rest`.
            problems.append((real + rest, "required but missing"))
        elif len(errors) > 1 and all(len(r) == 1 and isinstance(r[0], str) for r, _ in errors):
            tags = " or ".join(dict.fromkeys(str(r[0]) for r, _ in errors))
            problems.append((real, f"expected {tags}{got}"))
        else:
            message = str(first["msg"]).removeprefix("Value error, ")
            # Harbor's own validators often quote the value already.
            problems.append((real, message if str(value) in message else f"{message}{got}"))
    return problems


def task_config_parse(text: str, *, where: str) -> tuple[Any, dict[str, Any]]:
    """Parse task.toml text with Harbor's TaskConfig; raise TaskFormatError naming the line."""
    from harbor.models.task.config import TaskConfig

    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = _TOML_POS.match(str(exc))
        if match:
            raise TaskFormatError(
                where, f"line {match['line']}, column {match['col']}: invalid TOML: {match['msg']}"
            ) from None
        raise TaskFormatError(where, f"invalid TOML: {exc}") from None
    try:
        with warnings.catch_warnings():
            # Legacy keys (memory = "2G", allow_internet) are accepted with a warning.
            warnings.simplefilter("ignore")
            config = TaskConfig.model_validate(raw)
    except ValidationError as exc:
        messages = []
        for loc, message in pydantic_problems(exc, raw):
            str_loc = tuple(str(p) for p in loc)
            line = _toml_key_line(text, str_loc) if str_loc else None
            prefix = f"line {line}: " if line else ""
            label = _toml_label(loc)
            messages.append(f"{prefix}{label}: {message}" if label else f"{prefix}{message}")
        raise TaskFormatError(where, "; ".join(messages)) from None
    except ValueError as exc:  # a model validator that raised outside pydantic's wrapping
        raise TaskFormatError(where, str(exc)) from None
    _numbers_check(config.model_dump(), text=text, where=where)
    return config, config.model_dump(mode="json")


# Harbor's models take any number here; a task that asks for -1 MB or a 0 s timeout can
# never run, so it is refused at import, naming the key. Every *_sec is a duration.
_POSITIVE_KEYS = frozenset({"cpus", "memory_mb", "storage_mb"})
_NON_NEGATIVE_KEYS = frozenset({"gpus", "retries", "start_period_sec"})
_MEGABYTES_MAX = 2**31 - 1  # memory_mb and storage_mb are stored as 32-bit integers


def _numbers(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], float]]:
    """(location, value) of every number in a dumped config."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _numbers(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _numbers(value, (*path, i))
    elif isinstance(node, int | float) and not isinstance(node, bool):
        yield path, node


def _number_problem(path: tuple[Any, ...], value: float) -> str | None:
    if not math.isfinite(value):
        return "must be a finite number"  # TOML has inf and nan; JSON (and the database) has not
    key = path[-1] if isinstance(path[-1], str) else ""
    if path[0] == "metadata":
        return None  # the author's own data
    if key in _NON_NEGATIVE_KEYS:
        return "must not be negative" if value < 0 else None
    if key in _POSITIVE_KEYS or key.endswith("_sec"):
        if value <= 0:
            return "must be positive"
    if key.endswith("_mb") and value > _MEGABYTES_MAX:
        return f"must be at most {_MEGABYTES_MAX}"
    return None


def _numbers_check(dumped: dict[str, Any], *, text: str, where: str) -> None:
    messages = []
    for path, value in _numbers(dumped):
        problem = _number_problem(path, value)
        if problem:
            line = _toml_key_line(text, tuple(str(p) for p in path))
            prefix = f"line {line}: " if line else ""
            messages.append(f"{prefix}{_toml_label(path)}: {problem} (got {value!r})")
    if messages:
        raise TaskFormatError(where, "; ".join(messages))


def _toml_label(loc: tuple[Any, ...]) -> str:
    """("environment", "cpus") -> "[environment].cpus"; ("steps", 0, "name") -> "steps[0].name"."""
    if not loc:
        return ""
    if len(loc) == 1 or any(isinstance(p, int) for p in loc):
        return loc_format(loc)
    return f"[{'.'.join(str(p) for p in loc[:-1])}].{loc[-1]}"
