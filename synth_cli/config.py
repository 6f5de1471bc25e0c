"""The CLI's configuration: where it finds the server and its token, and its tuning.

Order: the environment (SYNTH_API_URL, SYNTH_TOKEN) wins over the user config file
`${SYNTH_CONFIG_DIR:-~/.config/synth}/config.json`, which `synth login` writes. The file
holds a secret, so it is created 0600 inside a 0700 directory, and written atomically
(a crash mid-write never leaves a truncated config behind).

Every environment variable the CLI reads is read here (synth_cli/README.md lists them),
strictly: a value that does not parse is a usage error naming the variable, not a silent
default.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from synth_cli.errors import CliError, UsageError


@dataclass(frozen=True)
class Settings:
    url: str
    token: str


def _env_text(name: str) -> str | None:
    """The variable's value, or None when it is unset or empty."""
    return os.environ.get(name) or None


def _env_int(name: str, default: int, *, minimum: int) -> int:
    raw = _env_text(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"{name} must be a whole number, not {raw!r}") from None
    if value < minimum:
        raise UsageError(f"{name} must be at least {minimum}, not {value}")
    return value


def _env_seconds(name: str, default: float | None, *, positive: bool) -> float | None:
    raw = _env_text(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{name} must be a number of seconds, not {raw!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise UsageError(
            f"{name} must be a {'positive' if positive else 'non-negative'} number of seconds, not {raw!r}"
        )
    return value


def http_retries() -> int:
    """SYNTH_HTTP_RETRIES: retries per request after the first attempt (default 3)."""
    return _env_int("SYNTH_HTTP_RETRIES", 3, minimum=0)


def http_retry_wait() -> float:
    """SYNTH_HTTP_RETRY_WAIT: the first backoff in seconds (default 0.5); it doubles each retry."""
    wait = _env_seconds("SYNTH_HTTP_RETRY_WAIT", 0.5, positive=False)
    assert wait is not None
    return wait


def follow_retries() -> int:
    """SYNTH_FOLLOW_RETRIES: consecutive failed reconnects of an event stream (default 8)."""
    return _env_int("SYNTH_FOLLOW_RETRIES", 8, minimum=0)


def follow_server_timeout() -> float | None:
    """SYNTH_FOLLOW_SERVER_TIMEOUT: ask the server to end each event stream after this many
    seconds (the client resumes it); None leaves it to the server."""
    return _env_seconds("SYNTH_FOLLOW_SERVER_TIMEOUT", None, positive=True)


def claude_bin() -> str | None:
    """SYNTH_CLAUDE_BIN: the Claude Code executable `synth claude` runs."""
    return _env_text("SYNTH_CLAUDE_BIN")


def codex_bin() -> str | None:
    """SYNTH_CODEX_BIN: the Codex executable `synth codex` runs."""
    return _env_text("SYNTH_CODEX_BIN")


def proxy_url() -> str | None:
    """SYNTH_PROXY_URL: where `synth claude` and `synth codex` reach the model proxy, instead of the address
    the server names (e.g. through a tunnel)."""
    raw = _env_text("SYNTH_PROXY_URL")
    return url_normalize(raw) if raw else None


def config_dir() -> Path:
    configured = _env_text("SYNTH_CONFIG_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".config" / "synth"


def config_path() -> Path:
    return config_dir() / "config.json"


def url_normalize(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"server URL must start with http:// or https://, not {url!r}")
    # Accept the API root too (people paste what they see in the docs).
    return url.removesuffix("/api")


def config_read() -> dict[str, str]:
    path = config_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CliError(f"{path}: cannot read the config ({exc}); run `synth login` again") from None
    if not isinstance(data, dict):
        raise CliError(f"{path}: not a JSON object; run `synth login` again")
    return {k: v for k, v in data.items() if isinstance(v, str)}


def config_write(*, url: str, token: str) -> Path:
    directory = config_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    # mkdir's mode is filtered by the umask and not applied to an existing directory.
    os.chmod(directory, 0o700)
    path = config_path()
    # mkstemp creates the file 0600 from the start, so the token is never world-readable.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".config-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"url": url, "token": token}, handle, indent=2)
            handle.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def settings_load() -> Settings:
    """The effective URL and token, or a one-line hint at how to provide them."""
    stored = config_read()
    url = _env_text("SYNTH_API_URL") or stored.get("url") or ""
    token = _env_text("SYNTH_TOKEN") or stored.get("token") or ""
    if not url or not token:
        missing = "server URL" if not url else "token"
        raise CliError(f"no {missing} configured: run `synth login` or set SYNTH_API_URL and SYNTH_TOKEN")
    return Settings(url=url_normalize(url), token=token)
