"""`synth codex`: the private CODEX_HOME an interactive Codex session on a Synth model uses.

Codex reads its provider from ``$CODEX_HOME/config.toml`` (recent versions ignore
OPENAI_BASE_URL), so the session gets a home of its own under the CLI's config directory,
``${SYNTH_CONFIG_DIR:-~/.config/synth}/codex``, 0700: its config names the model proxy's
TCP listener as a Responses provider, the route as the model, and the variable that holds
the session's short-lived credential (:data:`CREDENTIAL_ENV`; the value is never written).
The config is rewritten on every start; what Codex keeps there itself (sessions to resume,
history) stays.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from synth_cli.config import config_dir

CREDENTIAL_ENV = "SYNTH_MODEL_CREDENTIAL"
PROVIDER = "synth"


def codex_home() -> Path:
    return config_dir() / "codex"


def session_config(*, base_url: str, route: str) -> str:
    """The config.toml of a session on ``route`` through the proxy at ``base_url``."""

    def toml(value: str) -> str:
        return json.dumps(value)  # JSON's string escapes are TOML's

    return "\n".join(
        [
            "# Written by `synth codex` on every start; edits are lost.",
            f"model = {toml(route)}",
            f"model_provider = {toml(PROVIDER)}",
            # The proxy serves a model, not OpenAI's hosted tools.
            'web_search = "disabled"',
            'model_reasoning_summary = "none"',
            "",
            f"[model_providers.{PROVIDER}]",
            'name = "Synth"',
            f"base_url = {toml(base_url.rstrip('/') + '/v1')}",
            'wire_api = "responses"',
            f"env_key = {toml(CREDENTIAL_ENV)}",
            "",
        ]
    )


def session_home_write(*, base_url: str, route: str) -> Path:
    """Create (0700) the session's CODEX_HOME, write its config.toml (0600, atomically), and
    return the directory."""
    home = codex_home()
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    partial = home / f".config.toml.{os.getpid()}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(session_config(base_url=base_url, route=route))
    os.replace(partial, home / "config.toml")
    return home
