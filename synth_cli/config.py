"""Where the CLI finds the server and its token.

Order: the environment (SYNTH_API_URL, SYNTH_TOKEN) wins over the user config file
`${SYNTH_CONFIG_DIR:-~/.config/synth}/config.json`, which `synth login` writes. The file
holds a secret, so it is created 0600 inside a 0700 directory, and written atomically
(a crash mid-write never leaves a truncated config behind).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from synth_cli.errors import CliError, UsageError


@dataclass(frozen=True)
class Settings:
    url: str
    token: str


def config_dir() -> Path:
    configured = os.environ.get("SYNTH_CONFIG_DIR")
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
    url = os.environ.get("SYNTH_API_URL") or stored.get("url") or ""
    token = os.environ.get("SYNTH_TOKEN") or stored.get("token") or ""
    if not url or not token:
        missing = "server URL" if not url else "token"
        raise CliError(f"no {missing} configured: run `synth login` or set SYNTH_API_URL and SYNTH_TOKEN")
    return Settings(url=url_normalize(url), token=token)
