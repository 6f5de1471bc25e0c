"""Launch constraints: the names a recipe may not set because they belong to the platform.

The platform decides where model traffic goes (the bridge to the capture proxy), which
credential it carries (scoped to one attempt), which model snapshot answers (the recipe's
model binding, pinned in the run) and how the harness is driven (headless, stream-json
transcript, no permission prompts). A recipe that sets any of these is rejected with a
RecipeInvalid naming the field (a 400 from the API), rather than silently overridden, so its
author knows.

These checks catch mistakes and make intent explicit; they are not the security
boundary. That is the sandbox (no network but the bridge) and the proxy, which only
serves the snapshot the per-attempt credential is bound to.

Decided and deliberately NOT reserved:
- ``--permission-mode`` IS reserved (with ``--dangerously-skip-permissions``): in the
  sandbox nobody can answer a permission prompt, so the platform always runs Claude Code
  with bypassPermissions and the sandbox is the boundary; any other mode would hang or
  fail tool calls and make attempts incomparable.
- ``--mcp-config`` / ``--strict-mcp-config`` (and a ``.mcp.json`` file) are allowed: MCP
  servers are tools, part of the agent being evaluated. They run inside the same sandbox
  with the same network, so they cannot reach a model or anything else except through
  the capture proxy.
- ``--max-turns``, ``--system-prompt``, ``--append-system-prompt``, ``--allowedTools``,
  ``--disallowedTools``, ``--agents``, ``--verbose`` are the recipe's to choose.
- Codex: ``-c``/``--config``, ``--profile``, ``--model``, ``--sandbox``, the approval and
  provider switches and ``--cd`` are reserved (the platform's config.toml decides those);
  ``--enable``/``--disable`` (features), ``--ephemeral``, ``--output-last-message``,
  ``--output-schema``, ``--add-dir``, ``--image`` and AGENTS.md files are the recipe's.
- For engine "command" the recipe owns the whole argv, so no flag is reserved there; its
  environment is still checked.

Every list below is data: (pattern, why). Env patterns are shell-style globs matched on
the upper-cased name, because proxy variables are read in either case and no one needs a
lower-case twin of a reserved name.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

from synth_launcher.engines import ENGINES
from synth_launcher.plan import CREDENTIAL_MARKER

_ROUTE = "the platform points the harness at the bridge to the capture proxy; another endpoint would bypass capture"
_KEY = (
    "the platform injects a credential scoped to this attempt; a provider key would bypass capture, and a secret "
    "must not sit in a recipe every member can read and that is pinned forever"
)
_MODEL = "the model comes from the recipe's model binding (the proxy serves the snapshot pinned in the run)"
_PROVIDER = "switches the harness to another provider, bypassing the proxy"
_NETWORK = "the sandbox's network path is the platform's; a proxy setting would reroute or exempt traffic"
_SECRET = (
    "secrets do not belong in a recipe that every member can read and that is pinned forever; set the value "
    f"to {CREDENTIAL_MARKER} to pass the scoped per-attempt credential"
)

# (glob on the upper-cased name, why, whether the value "${credential}" is acceptable)
RESERVED_ENV: tuple[tuple[str, str, bool], ...] = (
    ("ANTHROPIC_BASE_URL", _ROUTE, False),
    ("ANTHROPIC_*_BASE_URL", _PROVIDER, False),  # Bedrock, Vertex, Foundry endpoints
    ("ANTHROPIC_API_KEY", _KEY, False),
    ("ANTHROPIC_AUTH_TOKEN", _KEY, False),
    ("ANTHROPIC_MODEL", _MODEL, False),
    ("ANTHROPIC_DEFAULT_*_MODEL", _MODEL, False),  # OPUS, SONNET, HAIKU aliases
    ("ANTHROPIC_SMALL_FAST_MODEL", _MODEL, False),
    # Subagent calls must hit the same snapshot so an attempt's trajectory is one policy's.
    ("CLAUDE_CODE_SUBAGENT_MODEL", _MODEL, False),
    (
        "ANTHROPIC_CUSTOM_HEADERS",
        "model calls carry the platform's correlation headers; extra ones could forge them",
        False,
    ),
    ("OPENAI_BASE_URL", _ROUTE, False),
    ("OPENAI_API_BASE", _ROUTE, False),
    (
        "CODEX_HOME",
        "the platform writes Codex's configuration (provider, model, approvals, network) into its own CODEX_HOME",
        False,
    ),
    ("CLAUDE_CODE_USE_BEDROCK", _PROVIDER, False),
    ("CLAUDE_CODE_USE_VERTEX", _PROVIDER, False),
    ("CLAUDE_CODE_USE_FOUNDRY", _PROVIDER, False),
    ("HTTP_PROXY", _NETWORK, False),
    ("HTTPS_PROXY", _NETWORK, False),
    ("ALL_PROXY", _NETWORK, False),
    ("NO_PROXY", _NETWORK, False),
    ("IS_SANDBOX", "the platform sets it so that Claude Code accepts bypassPermissions as root in the sandbox", False),
    (
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "the platform sets it so that nothing but model calls leaves the harness",
        False,
    ),
    ("SYNTH_*", "the platform's own launch variables (bridge address, correlation ids)", False),
    ("*_API_KEY", _SECRET, True),
    ("*_TOKEN", _SECRET, True),
    ("*_SECRET_ACCESS_KEY", _SECRET, True),  # AWS, which would also unlock Bedrock
)

_HEADLESS = "the platform runs the harness headless and delivers the instruction as instruction.via says"
_TRANSCRIPT = "the platform reads the harness's stream-json transcript"
_PERMISSIONS = (
    "no one can answer a permission prompt in the sandbox, so the platform always runs with bypassPermissions "
    "and the sandbox is the boundary"
)
_SETTINGS = "a settings file can set env, model, apiKeyHelper and permissions, everything reserved here"

_HARNESS_FLAGS: tuple[tuple[str, str], ...] = (
    ("--model", _MODEL),
    ("--fallback-model", _MODEL),
    ("--settings", _SETTINGS),
    ("--setting-sources", _SETTINGS),
    ("--permission-mode", _PERMISSIONS),
    ("--dangerously-skip-permissions", _PERMISSIONS),
    ("--allow-dangerously-skip-permissions", _PERMISSIONS),
    ("--print", _HEADLESS),
    ("-p", _HEADLESS),
    ("--output-format", _TRANSCRIPT),
    ("--input-format", _TRANSCRIPT),
    ("--api-key", _KEY),
    ("--session-id", "each attempt gets a fresh session; a fixed id would merge attempts' calls in capture"),
)
_CODEX_CONFIG = (
    "the platform writes Codex's config.toml (the bridge as its provider, the route as its model, no approvals, "
    "no sandbox of its own, nothing that reaches the network); an override could undo any of it"
)
_CODEX_SANDBOX = (
    "the sandbox is the boundary: the platform runs Codex with approval_policy never and no sandbox of its own"
)
_CODEX_FLAGS: tuple[tuple[str, str], ...] = (
    ("--config", _CODEX_CONFIG),
    ("-c", _CODEX_CONFIG),
    ("--profile", _CODEX_CONFIG),
    ("-p", _CODEX_CONFIG),
    ("--ignore-user-config", _CODEX_CONFIG),
    ("--model", _MODEL),
    ("-m", _MODEL),
    ("--oss", _PROVIDER),
    ("--local-provider", _PROVIDER),
    ("--remote", _PROVIDER),
    ("--remote-auth-token-env", _PROVIDER),
    ("--sandbox", _CODEX_SANDBOX),
    ("-s", _CODEX_SANDBOX),
    ("--dangerously-bypass-approvals-and-sandbox", _CODEX_SANDBOX),
    ("--approve-for-me", _CODEX_SANDBOX),
    ("--full-auto", _CODEX_SANDBOX),
    ("--cd", "the recipe's workdir is where Codex runs"),
    ("-C", "the recipe's workdir is where Codex runs"),
)
# Per engine, the flags of a command line the platform builds. "command" has none: its
# recipe owns the whole argv. synth-mini takes the same driving flags as Claude Code, and
# the ones its argv builder sets (the engine registry's platform_args).
RESERVED_ARGS: dict[str, tuple[tuple[str, str], ...]] = {
    "claude-code": _HARNESS_FLAGS + ENGINES["claude-code"].platform_args,
    "synth-mini": _HARNESS_FLAGS + ENGINES["synth-mini"].platform_args,
    "codex": _CODEX_FLAGS + ENGINES["codex"].platform_args,
}

# Per engine, files (relative to the working directory, normalised) the harness reads
# as configuration that could undo the reservations above.
RESERVED_FILES: dict[str, tuple[tuple[str, str], ...]] = {
    "claude-code": (
        (".claude/settings.json", _SETTINGS),
        (".claude/settings.local.json", _SETTINGS),
    ),
    # A project's config layer, read on top of CODEX_HOME's.
    "codex": ((".codex/config.toml", _CODEX_CONFIG),),
}

_SHORT_BUNDLE = re.compile(r"^-[A-Za-z]+$")


def reserved_env_find(*, name: str, value: str) -> str | None:
    """Why env `name` (set to `value`) is reserved, or None if the recipe may set it."""
    matches = [(why, credential_ok) for glob, why, credential_ok in RESERVED_ENV if fnmatchcase(name.upper(), glob)]
    if not matches:
        return None
    if value == CREDENTIAL_MARKER and all(credential_ok for _, credential_ok in matches):
        return None
    return matches[0][0]


def reserved_arg_find(*, engine: str, arg: str) -> str | None:
    """Why `arg` is reserved for `engine` (as --flag, --flag=value or in a -xyz bundle), or None."""
    for flag, why in RESERVED_ARGS.get(engine, ()):
        if flag.startswith("--"):
            if arg == flag or arg.startswith(flag + "="):
                return why
        elif _SHORT_BUNDLE.match(arg) and flag[1] in arg[1:]:
            return why
    return None


def reserved_file_find(*, engine: str, path: str) -> str | None:
    for reserved, why in RESERVED_FILES.get(engine, ()):
        if path == reserved:
            return why
    return None
