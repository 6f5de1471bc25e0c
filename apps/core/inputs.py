"""The input rules every request is held to, checked once where it is parsed.

* Text is text: no string anywhere in a JSON body (object keys included, at any depth), a
  query string, a path or a header holds U+0000 or a lone surrogate (U+D800..U+DFFF).
  PostgreSQL cannot store the first and UTF-8 cannot encode the second, so either would
  fail a write or the answer after the input had been accepted.
* Numbers are finite: ``1e400`` parses to infinity, which no JSON encoder writes back.
* Nesting is bounded: validators and encoders recurse, and Python's stack is not.
* An integer is an integer: a JSON integer in a body, decimal digits in a query string.
  ``2.0``, ``"2"`` and ``true`` are refused with the field's path rather than normalized
  (the OpenAPI/pydantic "strict" choice): what is accepted is exactly what is stored.
  JSON Schema's "integer" admits ``2.0``, so the validators (``strict_validator``, defined
  in the Django-free synth_common.strict_schema and re-exported here) redefine it.

The DRF parsers (apps.core.parsers), the /v1 views and the project's middleware call these.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

import orjson

from apps.core.errors import ValidationFailed
from synth_common.strict_schema import is_json_integer, strict_validator

MAX_JSON_DEPTH = 64  # a recipe, a plan or a worker report is a few levels deep

_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
# A NUL or a lone surrogate can only reach a parsed string through a \u escape: a raw NUL
# is invalid JSON and the text was decoded strictly. Without one, the strings need no scan.
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
_DIGITS = re.compile(r"-?[0-9]{1,30}")
# orjson reads an integer beyond 64 bits as a float (json keeps it exact): a float at least
# this large sends the text to json.
_WIDE = float(2**63)

Path = tuple[str | int, ...]


class InputProblem(ValueError):
    """Input that breaks a rule above; ``path`` locates it in a JSON value (None: not JSON at all)."""

    def __init__(self, message: str, *, path: Path | None = ()) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


def text_problem(text: str) -> str | None:
    """What is wrong with ``text`` ("contains a NUL character (U+0000)"), or None."""
    match = _BAD_TEXT.search(text)
    if match is None:
        return None
    if match.group() == "\x00":
        return "contains a NUL character (U+0000)"
    return f"contains a lone surrogate (U+{ord(match.group()):04X})"


def _any_problem(*, value: Any, max_depth: int, text: bool, wide_floats: bool = False) -> bool:
    """Whether json_value_check would raise: the same rules, without the paths (a model
    call's body is thousands of nodes, and a path per node cost more than the parse). Only
    containers go on the stack; scalars are judged where they are met. `wide_floats`: a
    float beyond 64-bit integers counts too (orjson reads such an integer as a float)."""
    if not isinstance(value, dict | list):  # a lone scalar: judged as a list's only item
        return _any_problem(value=[value], max_depth=max_depth + 1, text=text, wide_floats=wide_floats)
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth >= max_depth:
            return True
        if isinstance(node, dict):
            if text and any(isinstance(key, str) and _BAD_TEXT.search(key) is not None for key in node):
                return True
            children = node.values()
        else:
            children = node
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
            elif isinstance(child, str):
                if text and _BAD_TEXT.search(child) is not None:
                    return True
            elif isinstance(child, float):
                if not (-_WIDE < child < _WIDE) if wide_floats else not math.isfinite(child):
                    return True
    return False


def json_value_check(*, value: Any, max_depth: int = MAX_JSON_DEPTH, text: bool = True) -> None:
    """Raise InputProblem at the first bad string, key, number or nesting level (document order)."""
    if not _any_problem(value=value, max_depth=max_depth, text=text):
        return
    # Something is wrong: walk again, in document order with paths, to say what and where.
    stack: list[tuple[Any, Path, int]] = [(value, (), 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, str):
            problem = text_problem(node) if text else None
            if problem:
                raise InputProblem(f"the string {problem}", path=path)
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise InputProblem("numbers must be finite", path=path)
        elif isinstance(node, dict | list):
            if depth >= max_depth:
                raise InputProblem(f"nested deeper than {max_depth} levels", path=path)
            items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
            for key, child in reversed(items):
                problem = text_problem(key) if text and isinstance(key, str) else None
                if problem:
                    raise InputProblem(f"an object key {problem}", path=path)
                stack.append((child, (*path, key), depth + 1))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def json_loads_strict(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON ``text`` and hold it to the rules above; InputProblem (path None) if not JSON.

    orjson parses first: with the rules' walk, a Claude Code body of 107 KB took 0.43 ms
    and takes 0.26 (a 9 KB one 0.10 and 0.07), to the same value, checked case by case (both
    refuse NaN, Infinity, control characters and trailing data, keep the last of duplicate
    keys and round numbers alike). json decides whenever they could differ or something is
    wrong: a text orjson refuses (json may read it, as a lone surrogate escape the rules then
    refuse by path, or says what is wrong in its own words), a float as wide as an integer
    beyond 64 bits, any broken rule."""
    suspect = _SUSPECT_ESCAPE.search(text) is not None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    else:
        if not _any_problem(value=value, max_depth=max_depth, text=suspect, wide_floats=True):
            return value
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise InputProblem(f"nested deeper than {max_depth} levels", path=None) from None
    except ValueError as exc:  # JSONDecodeError, an out-of-range number, an over-long integer
        raise InputProblem(f"not valid JSON: {exc}", path=None) from None
    json_value_check(value=value, max_depth=max_depth, text=suspect)
    return value


def field_path(parts: Sequence[str | int], *, prefix: str = "") -> str | None:
    """("plan", "task_names", 0) -> "plan.task_names[0]": the form every error's ``field`` uses."""
    out = prefix
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def query_digits(raw: str) -> bool:
    """Whether ``raw`` is an integer as a query string writes one: decimal digits only
    ("2.0", "2_0", " 2" and "٢" are not, although int() takes them)."""
    return _DIGITS.fullmatch(raw) is not None


def query_int(raw: str, *, name: str, minimum: int | None = None) -> int:
    """A query-string integer (see query_digits), or ValidationFailed naming ``name``."""
    if not query_digits(raw):
        raise ValidationFailed(f"{name} must be an integer (decimal digits), got {raw[:40]!r}", field=name)
    value = int(raw)
    if minimum is not None and value < minimum:
        raise ValidationFailed(f"{name} must be at least {minimum}", field=name)
    return value


__all__ = [
    "MAX_JSON_DEPTH",
    "InputProblem",
    "Path",
    "field_path",
    "is_json_integer",
    "json_loads_strict",
    "json_value_check",
    "query_digits",
    "query_int",
    "strict_validator",
    "text_problem",
]
