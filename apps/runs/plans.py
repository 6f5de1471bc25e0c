"""Plans, validated per run kind. Defaults are filled in so that a pinned plan is explicit.

Unknown keys are errors (a typo such as "attempts_per_tsk" must not silently run with
the default), and an integer is a JSON integer (2.0 is refused, see apps.core.inputs).
Error messages name the JSON path of the offending value.
"""

from __future__ import annotations

import copy
from typing import Any

from apps.core.errors import ValidationFailed
from apps.core.inputs import strict_validator

# The attempts' model calls are held to these (apps.trials.model_access.attempt_sampling,
# apps.proxy.calls.call_sampling): a value given here replaces the harness's own. No
# defaults: what is not given is the harness's, and a pinned plan must not claim otherwise.
_SAMPLING = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": 1},
        "max_tokens": {
            "type": "integer",
            "minimum": 1,
            "maximum": 1_000_000,
            "description": "a cap on each call's max_tokens (the route's max_output caps it too)",
        },
        "seed": {
            "type": "integer",
            "minimum": 0,
            "maximum": 2**62,
            "description": "each attempt's calls sample with seeds drawn from this, the attempt's place in the run "
            "and the prompt: a rerun of the plan samples the same tokens for the same prompts",
        },
    },
}
_RESOURCES = {
    "type": "object",
    "additionalProperties": False,
    "description": "Overrides of the task's own resources (task.toml [environment]).",
    "properties": {
        "cpus": {"type": "number", "exclusiveMinimum": 0},
        "memory_mb": {"type": "integer", "minimum": 16},
        "storage_mb": {"type": "integer", "minimum": 1},
    },
}
_EXECUTION = {
    "attempts_per_task": {
        "type": "integer",
        "minimum": 1,
        "maximum": 1024,
        "default": 1,
    },
    "max_concurrency": {
        "type": "integer",
        "minimum": 1,
        "maximum": 10_000,
        "default": 8,
    },
    "timeout_multiplier": {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": 100,
        "default": 1.0,
    },
    "agent_timeout_sec": {"type": "number", "exclusiveMinimum": 0},
    "verifier_timeout_sec": {"type": "number", "exclusiveMinimum": 0},
    "resources": _RESOURCES,
    "environment": {
        "type": "string",
        "description": "Harbor environment type or module:Class; default: the local sandbox",
        "default": "local",
    },
    "verifier": {
        "enum": ["task", "fresh"],
        "default": "task",
        "description": "task: verify as the task says (in the agent's environment, or a separate one); "
        "fresh: always in a fresh environment that receives only the workdir and declared outputs",
    },
    "sanitize_git": {
        "type": "boolean",
        "description": "strip repositories in the environment of remotes, other refs, reflogs and commits after "
        "HEAD before the agent starts; default: the task's [metadata] sanitize_git",
    },
    "on_lost": {"enum": ["retry", "fail"], "default": "retry"},
    "max_retries": {"type": "integer", "minimum": 0, "maximum": 10, "default": 1},
    "task_names": {
        "type": "array",
        "items": {"type": "string"},
        "description": "glob filter",
    },
    "sampling": _SAMPLING,
}

PLAN_SCHEMAS: dict[str, dict[str, Any]] = {
    "execute": {
        "type": "object",
        "additionalProperties": False,
        "properties": _EXECUTION,
    },
    "evaluate": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            **_EXECUTION,
            "retain_workdir": {
                "type": "boolean",
                "default": True,
                "description": "keep each attempt's final workdir as artifacts (what a regrade re-assesses)",
            },
        },
    },
    "regrade": {
        "type": "object",
        "additionalProperties": False,
        "required": ["source_run"],
        "properties": {
            "source_run": {"type": "string", "description": "the run whose retained outputs are re-assessed"},
            **{
                k: _EXECUTION[k]
                for k in (
                    "max_concurrency",
                    "timeout_multiplier",
                    "verifier_timeout_sec",
                    "resources",
                    "environment",
                    "on_lost",
                    "max_retries",
                )
            },
        },
    },
    "train": {
        "type": "object",
        "additionalProperties": False,
        "required": ["steps"],
        "properties": {
            **{k: v for k, v in _EXECUTION.items() if k != "attempts_per_task"},
            "retain_workdir": {"type": "boolean", "default": False},
            "backend": {"enum": ["local", "tinker"], "default": "local"},
            "batch_size": {"type": "integer", "minimum": 1, "default": 4},
            "group_size": {
                "type": "integer",
                "minimum": 2,
                "maximum": 1024,
                "default": 8,
            },
            "steps": {"type": "integer", "minimum": 1},
            "learning_rate": {"type": "number", "exclusiveMinimum": 0, "default": 4e-5},
            "lora_rank": {
                "type": "integer",
                "minimum": 1,
                "maximum": 1024,
                "default": 32,
            },
            "loss": {
                "enum": ["importance_sampling", "ppo", "cispo"],
                "default": "importance_sampling",
            },
            "save_every": {"type": "integer", "minimum": 1, "default": 5},
            "max_staleness": {
                "type": "integer",
                "minimum": 0,
                "maximum": 8,
                "default": 0,
                "description": "steps behind the trained weights a group may have sampled: 0 is the strict "
                "boundary (a batch samples the weights of the update before it); k > 0 lets the next batch "
                "sample the previous weights while an update runs, and excludes groups more than k behind",
            },
            "seed": {"type": "integer", "minimum": 0, "default": 0, "description": "LoRA initialisation seed"},
            "eligibility": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "min_valid_per_group": {
                        "type": "integer",
                        "minimum": 1,
                        "default": 2,
                    },
                    "require_reward_variance": {"type": "boolean", "default": True},
                },
            },
            # No default here: it applies only when the actor's model is a checkpoint, and the
            # training app pins "exact" then (apps.training.continuation).
            "continuation": {
                "enum": ["exact", "weights_only"],
                "description": "from a checkpoint: exact restores the optimizer state, the step and the dataset "
                "cursor; weights_only loads the weights with a fresh optimizer and the cursor at the start",
            },
            "dynamic_sampling": {
                "type": "object",
                "additionalProperties": False,
                "required": ["max_refills"],
                "description": "replace groups without learning signal with groups drawn from the dataset",
                "properties": {
                    "max_refills": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 1024,
                        "description": "extra groups one step may draw at most",
                    },
                },
            },
            "exclude_truncated": {
                "type": "boolean",
                "default": False,
                "description": "leave out attempts with a response cut at max_tokens",
            },
        },
    },
}
_Validator = strict_validator()
_VALIDATORS = {kind: _Validator(schema) for kind, schema in PLAN_SCHEMAS.items()}


def _path(parts: Any) -> str:
    out = "plan"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _fill_defaults(schema: dict[str, Any], value: dict[str, Any]) -> None:
    for key, sub in schema.get("properties", {}).items():
        if key not in value and "default" in sub:
            value[key] = copy.deepcopy(sub["default"])
        if isinstance(value.get(key), dict) and sub.get("type") == "object":
            _fill_defaults(sub, value[key])
        elif (
            key not in value
            and sub.get("type") == "object"
            and any("default" in p for p in sub.get("properties", {}).values())
        ):
            value[key] = {}
            _fill_defaults(sub, value[key])


def plan_normalize(*, kind: str, plan: Any) -> dict[str, Any]:
    """The validated plan with every default written out, or ValidationFailed naming the path."""
    if kind not in PLAN_SCHEMAS:
        raise ValidationFailed(f"kind must be one of {', '.join(PLAN_SCHEMAS)}", field="kind")
    if plan is None:
        plan = {}
    if not isinstance(plan, dict):
        raise ValidationFailed("plan must be a JSON object", field="plan")
    errors = sorted(_VALIDATORS[kind].iter_errors(plan), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        field = _path(err.absolute_path)
        message = err.message
        if err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
            if extra:
                field = f"{field}.{extra[0]}"
                message = f"unknown field {extra[0]!r} for a {kind} plan"
        raise ValidationFailed(f"{field}: {message}", field=field)
    normalized = copy.deepcopy(plan)
    _fill_defaults(PLAN_SCHEMAS[kind], normalized)
    return normalized


def plan_uses_local_sandbox(*, plan: dict[str, Any]) -> bool:
    """Whether a normalized plan's trials run in the local sandbox (its environment is absent,
    "local" with the local sandbox as the deployment's default, or the sandbox's import path)."""
    from django.conf import settings

    from synth_sandbox import ENVIRONMENT_IMPORT_PATH, environment_path_current

    name = plan.get("environment") or "local"
    name = settings.SYNTH_DEFAULT_ENVIRONMENT if name == "local" else name
    return environment_path_current(name) == ENVIRONMENT_IMPORT_PATH
