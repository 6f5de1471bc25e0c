"""The agent recipe: its JSON Schema (Draft 2020-12) and the validation that names the field.

Django-free: the launcher validates every recipe it interprets with :func:`recipe_validate`
(raising :class:`RecipeInvalid`), and the API's apps.profiles.schema wraps it into a 400.

A recipe says how to launch one agent attempt: which model it talks to, which engine
(harness) runs, the files, setup commands, arguments and environment it gets, how the
instruction reaches it, which outputs to collect and its limits. Every object in the
schema has ``additionalProperties: false`` so that a typo ("tiemout_sec") is an error
rather than a silently ignored field in a version that is then pinned forever.

Bindings. The launcher substitutes ``${task.<key>}``, ``${run.<key>}``, ``${model.<key>}``
and ``${credential}`` in ``workdir``, ``args``, ``env`` values, ``setup``, ``command``,
``outputs`` and an ``instruction.via`` file path. File ``content`` is written verbatim.
``${credential}`` (the scoped per-attempt model credential) is only accepted in ``env``
values: argv is visible in process listings and transcripts. Any other ``${NAME}`` or
``${NAME:-default}`` is left alone for the shell, so setup commands can use shell
variables; but ``${word.key}`` is never valid shell, so it is read as a binding and an
unknown namespace (``${tsak.workdir}``) is an error.

Defaults the launcher applies for an absent field (they are not written into the
canonical bytes, so the digest is of what the author published): files [], setup [],
args [], env {}, outputs [], workdir "${task.workdir}", instruction {"via": "argument"}.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator, ValidationError
from jsonschema.exceptions import best_match

from synth_common.strict_schema import strict_validator
from synth_launcher.engines import ENGINES as _REGISTRY
from synth_launcher.plan import BINDING_KEYS, LaunchError
from synth_launcher.reserved import reserved_arg_find, reserved_env_find, reserved_file_find

ENGINES = tuple(_REGISTRY)
# Engines that drive a model: a recipe for them must say which one. The others (the
# task's reference solution, doing nothing, an arbitrary command) may still bind one.
ENGINES_NEEDING_MODEL = tuple(name for name, engine in _REGISTRY.items() if engine.needs_model)
# Engines whose recipe gives the argv (``command``): required there, refused elsewhere.
ENGINES_WITH_COMMAND = tuple(name for name, engine in _REGISTRY.items() if engine.recipe_command)
BINDING_NAMESPACES = tuple(BINDING_KEYS)
# A recipe is small (files are instructions and configs, not datasets); the bound keeps
# every row of the versions table and every launch cheap.
MAX_RECIPE_BYTES = 1024 * 1024

# A path relative to the working directory: not absolute and no ".." segment, so a file
# cannot be written outside it.
_RELATIVE_PATH = r"^(?!/)(?!(?:[^/]*/)*\.\.(?:/|$))[^\x00]+$"
# An output path may be absolute (e.g. /logs/agent.txt) but has no ".." segment either.
_OUTPUT_PATH = r"^(?!(?:[^/]*/)*\.\.(?:/|$))[^\x00]+$"
_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class RecipeInvalid(LaunchError):
    """A recipe that breaks the schema or a platform rule; ``field`` is its JSON path
    (``files[0].path``), None when the recipe is not a JSON object at all."""


_STRINGS = {"type": "array", "items": {"type": "string"}}

RECIPE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://synth.invalid/schemas/agent-recipe.json",
    "title": "Synth agent recipe",
    "type": "object",
    "additionalProperties": False,
    "required": ["engine", "limits"],
    "properties": {
        "model": {
            "description": 'Exactly one of {"route": "<model route>"} or {"checkpoint": "ckpt_..."}.',
            "type": "object",
            "additionalProperties": False,
            "minProperties": 1,
            "maxProperties": 1,
            "properties": {
                "route": {
                    "type": "string",
                    "pattern": r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$",
                    "description": "a model route name such as qwen3-8b",
                },
                "checkpoint": {
                    "type": "string",
                    "pattern": r"^ckpt_[0-9a-z]{1,64}$",
                    "description": "a checkpoint id, ckpt_...",
                },
            },
        },
        "engine": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "version"],
            "properties": {
                "name": {"enum": list(ENGINES)},
                "version": {
                    "type": "string",
                    "pattern": r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$",
                    "description": "a version string such as 2.1",
                },
            },
        },
        "command": {
            "description": 'argv of the agent process; engine "command" only (args are appended).',
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "minLength": 1},
        },
        "files": {
            "description": "Written into the working directory before setup runs.",
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["path", "content"],
                "properties": {
                    "path": {
                        "type": "string",
                        "pattern": _RELATIVE_PATH,
                        "maxLength": 4096,
                        "description": "a path relative to the working directory, without '..' segments",
                    },
                    "content": {"type": "string"},
                    "mode": {
                        "type": "string",
                        "pattern": r"^0[0-7]{3}$",
                        "default": "0644",
                        "description": "an octal file mode such as 0644",
                    },
                },
            },
        },
        "setup": {"description": "Shell commands run in order before the agent.", **_STRINGS},
        "workdir": {"type": "string", "minLength": 1, "default": "${task.workdir}"},
        "args": _STRINGS,
        "env": {
            "type": "object",
            "propertyNames": {"pattern": _NAME, "maxLength": 256},
            "additionalProperties": {"type": "string"},
        },
        "instruction": {
            "type": "object",
            "additionalProperties": False,
            "required": ["via"],
            "properties": {
                "via": {
                    "type": "string",
                    "pattern": r"^(argument|stdin|file:[^\x00]+)$",
                    "description": '"argument", "stdin" or "file:<path>"',
                },
            },
        },
        "outputs": {
            "description": "Required output paths, collected as artifacts.",
            "type": "array",
            "uniqueItems": True,
            "items": {
                "type": "string",
                "pattern": _OUTPUT_PATH,
                "maxLength": 4096,
                "description": "a relative or absolute path without '..' segments",
            },
        },
        "limits": {
            "type": "object",
            "additionalProperties": False,
            "required": ["timeout_sec"],
            "properties": {
                # The agent's wall-clock deadline; setup and verification have their own.
                "timeout_sec": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
                "setup_timeout_sec": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
                # Claude Code keeps calling while the model keeps calling tools (over a
                # thousand calls a minute was observed); the proxy enforces this bound.
                "max_model_calls": {"type": "integer", "minimum": 1},
                # By default a non-zero agent exit is recorded and the verifier still
                # decides; set this to end such a trial as an error instead.
                "fail_on_nonzero_exit": {"type": "boolean"},
            },
        },
    },
    "allOf": [
        {
            "if": {
                "required": ["engine"],
                "properties": {
                    "engine": {"required": ["name"], "properties": {"name": {"enum": list(ENGINES_NEEDING_MODEL)}}}
                },
            },
            "then": {"required": ["model"]},
        },
        {
            "if": {
                "required": ["engine"],
                "properties": {
                    "engine": {"required": ["name"], "properties": {"name": {"enum": list(ENGINES_WITH_COMMAND)}}}
                },
            },
            "then": {"required": ["command"]},
            # {"not": {}} rather than false: jsonschema reports a false subschema without its path.
            "else": {"properties": {"command": {"not": {}, "$comment": 'engine "command" only'}}},
        },
    ],
}


def _pattern_ecma(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    # JSON Schema patterns are ECMA-262, where "$" matches only at the very end; Python's
    # re.search also lets "$" match before a trailing newline, which would let
    # "ANTHROPIC_BASE_URL\n" or a mode of "0644\n" through. Require the match to reach the end.
    if not validator.is_type(instance, "string"):
        return
    match = re.search(pattern, instance)
    if match is None or (pattern.endswith("$") and match.end() != len(instance)):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


# "integer" is a JSON integer: 2.0 is refused, not normalized (synth_common.strict_schema).
_Validator = strict_validator(keywords={"pattern": _pattern_ecma})
Draft202012Validator.check_schema(RECIPE_SCHEMA)
_VALIDATOR = _Validator(RECIPE_SCHEMA)


def json_path(parts: Any) -> str | None:
    """("files", 0, "path") -> "files[0].path"; the form every error's `field` uses."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def _engine_name(recipe: dict[str, Any]) -> str:
    engine = recipe.get("engine")
    return str(engine.get("name")) if isinstance(engine, dict) else "?"


def _schema_error(error: ValidationError, recipe: dict[str, Any]) -> RecipeInvalid:
    """One schema error as a RecipeInvalid naming the JSON path and saying it plainly."""
    parts = list(error.absolute_path)
    conditional = "then" in error.schema_path or "else" in error.schema_path
    if error.validator == "required":
        missing = [key for key in error.validator_value if key not in error.instance]
        field = json_path([*parts, missing[0]])
        suffix = f" for engine {_engine_name(recipe)!r}" if conditional else ""
        return RecipeInvalid(f"{field} is required{suffix}", field=field)
    if error.validator == "additionalProperties" and error.validator_value is False:
        known = error.schema.get("properties", {})
        extra = sorted(key for key in error.instance if key not in known)
        field = json_path([*parts, extra[0]])
        allowed = ", ".join(sorted(known))
        return RecipeInvalid(f"{field} is not a known field (allowed here: {allowed})", field=field)
    if error.validator == "not" and error.validator_value == {}:  # forbidden in this context
        field = json_path(parts)
        return RecipeInvalid(f"{field} is not allowed for engine {_engine_name(recipe)!r}", field=field)
    if "propertyNames" in error.schema_path:
        field = json_path([*parts, str(error.instance)])
        return RecipeInvalid(f"{field}: environment variable names match {_NAME}", field=field)
    if error.validator in ("minProperties", "maxProperties") and parts == ["model"]:
        return RecipeInvalid('model must have exactly one of "route" or "checkpoint"', field="model")
    field = json_path(parts)
    if error.validator == "pattern" and "description" in error.schema:
        return RecipeInvalid(f"{field}: {error.instance!r} is not {error.schema['description']}", field=field)
    return RecipeInvalid(f"{field}: {error.message}" if field else error.message, field=field)


_BINDING = re.compile(r"\$\{([^}]*)\}")
_BINDING_CANDIDATE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.")
_BINDING_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _bindings_check(*, value: str, field: str, credential_ok: bool) -> None:
    for match in _BINDING.finditer(value):
        inner = match.group(1)
        if inner == "credential":
            if not credential_ok:
                raise RecipeInvalid(
                    f"{field}: ${{credential}} may only be used in env values (argv and files are visible "
                    "in process listings and transcripts)",
                    field=field,
                )
            continue
        if not _BINDING_CANDIDATE.match(inner):
            continue  # ${HOME}, ${VAR:-default}: the shell's, not ours
        namespace, _, key = inner.partition(".")
        if namespace not in BINDING_NAMESPACES or not _BINDING_KEY.match(key):
            known = ", ".join(f"${{{ns}.*}}" for ns in BINDING_NAMESPACES)
            raise RecipeInvalid(
                f"{field}: unknown binding {match.group(0)} (known: {known}, ${{credential}})", field=field
            )


def _strings_at(recipe: dict[str, Any], key: str) -> Iterator[tuple[str, str]]:
    value = recipe.get(key)
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield f"{key}[{i}]", item


def _semantic_check(recipe: dict[str, Any]) -> None:
    """What a schema cannot say: platform-reserved names, bindings, duplicate paths."""
    engine = recipe["engine"]["name"]
    for name, value in recipe.get("env", {}).items():
        found = reserved_env_find(name=name, value=value)
        if found:
            raise RecipeInvalid(f"env.{name} is reserved by the platform: {found}", field=f"env.{name}")
    for i, arg in enumerate(recipe.get("args", [])):
        found = reserved_arg_find(engine=engine, arg=arg)
        if found:
            raise RecipeInvalid(f"args[{i}] ({arg!r}) is reserved by the platform: {found}", field=f"args[{i}]")
    seen: dict[str, int] = {}
    for i, spec in enumerate(recipe.get("files", [])):
        path = posixpath.normpath(spec["path"])
        if path in seen:
            raise RecipeInvalid(
                f"files[{i}].path: {spec['path']!r} is also files[{seen[path]}]", field=f"files[{i}].path"
            )
        seen[path] = i
        found = reserved_file_find(engine=engine, path=path)
        if found:
            raise RecipeInvalid(
                f"files[{i}].path ({path!r}) is reserved by the platform: {found}", field=f"files[{i}].path"
            )
    via = recipe.get("instruction", {}).get("via", "")
    if via.startswith("file:"):
        path = via[len("file:") :]
        if re.search(_OUTPUT_PATH, path) is None:
            raise RecipeInvalid(
                "instruction.via: the file path may not contain a '..' segment", field="instruction.via"
            )
        _bindings_check(value=path, field="instruction.via", credential_ok=False)
    for key in ("workdir", "args", "setup", "command", "outputs"):
        for field, value in _strings_at(recipe, key):
            _bindings_check(value=value, field=field, credential_ok=False)
    for name, value in recipe.get("env", {}).items():
        _bindings_check(value=value, field=f"env.{name}", credential_ok=True)


def recipe_validate(*, recipe: Any) -> None:
    """Raise RecipeInvalid naming the first offending JSON path, or return."""
    if not isinstance(recipe, dict):
        raise RecipeInvalid("a recipe is a JSON object")
    error = best_match(_VALIDATOR.iter_errors(recipe))
    if error is not None:
        raise _schema_error(error, recipe)
    _semantic_check(recipe)
