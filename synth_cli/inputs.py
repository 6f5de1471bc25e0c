"""Command-line inputs: `@file.json` arguments, dataset and profile references.

Everything here fails with a UsageError (exit 2) before any request is sent, naming the
file and the position of a JSON syntax error so it can be fixed without guessing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synth_cli.errors import UsageError

DATASET_REF = re.compile(r"^(?P<org>[^/@\s]+)/(?P<name>[^/@\s]+)@(?P<version>[^/@\s]+)$")
DATASET_NAME = re.compile(r"^(?:(?P<org>[^/@\s]+)/)?(?P<name>[^/@\s]+)$")
PROFILE_REF = re.compile(r"^(?P<name>[^/@\s]+)(?:@(?P<version>[1-9][0-9]*))?$")


def json_file_load(path_text: str) -> Any:
    """Parse a JSON file; the error says which file and where, in one line."""
    path = Path(path_text).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path_text}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path_text}: is a directory, not a JSON file") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path_text}: not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"{path_text}: cannot read ({exc.strerror or exc})") from None
    return json_text_load(text, where=path_text)


def json_text_load(text: str, *, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


def json_object_arg(value: str, *, option: str) -> dict[str, Any]:
    """`@file.json` or an inline JSON object (`'{"attempts_per_task": 2}'`)."""
    if value.startswith("@"):
        where = value[1:]
        data = json_file_load(where)
    elif value.lstrip().startswith("{"):
        where = option
        data = json_text_load(value, where=option)
    else:
        raise UsageError(f"{option} takes @FILE.json or an inline JSON object, not {value!r}")
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a JSON object, got {type(data).__name__}")
    return data


def dataset_ref_parse(value: str) -> str:
    if not DATASET_REF.match(value):
        raise UsageError(f"malformed dataset reference {value!r}: expected ORG/NAME@VERSION (e.g. team/evaluation@v1)")
    return value


def dataset_name_parse(value: str) -> tuple[str | None, str]:
    """`ORG/NAME` (or just `NAME`: the organization is the token's) -> (org, name)."""
    match = DATASET_NAME.match(value)
    if not match:
        raise UsageError(f"malformed dataset name {value!r}: expected ORG/NAME (e.g. team/evaluation)")
    return match["org"], match["name"]


@dataclass(frozen=True)
class RecipeFile:
    """`@agent.json`: a recipe to publish (or find) before it is referenced."""

    path: str
    recipe: dict[str, Any]

    @property
    def default_name(self) -> str:
        return Path(self.path).stem


@dataclass(frozen=True)
class ProfileRef:
    """`NAME` or `NAME@VERSION`: an already published profile (latest version if none)."""

    name: str
    version: int | None


def profile_arg(value: str, *, option: str) -> RecipeFile | ProfileRef:
    if value.startswith("@"):
        path = value[1:]
        data = json_file_load(path)
        if not isinstance(data, dict):
            raise UsageError(f"{path}: a recipe must be a JSON object, got {type(data).__name__}")
        return RecipeFile(path=path, recipe=data)
    return profile_ref_parse(value, option=option)


def profile_ref_parse(value: str, *, option: str = "profile") -> ProfileRef:
    match = PROFILE_REF.match(value)
    if not match:
        raise UsageError(f"malformed {option} reference {value!r}: expected NAME, NAME@VERSION or @FILE.json")
    return ProfileRef(name=match["name"], version=int(match["version"]) if match["version"] else None)
