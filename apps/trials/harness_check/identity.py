"""Which harness build an engine runs on this installation, and whether a train run needs
that build to have passed ``manage.py harness_check``.

The rule: a check applies to every engine whose harness the platform pins and launches
itself, because only then does the platform know which build runs (its digest) and can it
script a task for it. Among those, a train run REQUIRES a passing check for a harness that
is installed apart from the platform's code (claude-code and codex: an npm package's native
executable, ``SYNTH_CLAUDE_CODE_BIN``, ``SYNTH_CODEX_SANDBOX_BIN``), since that build can change under an unchanged platform (an
``npm ci`` of another pin, a replaced file) and training then learns from whatever it sends.

* claude-code: digest = sha256 of the resolved executable the trials host binds into
  sandboxes; version = its npm package's version. Checkable and required.
* codex: the same for the Codex CLI's native executable (the platform package npm installs
  with @openai/codex). Checkable and required.
* synth-mini: digest = sha256 of ``synth_launcher/mini_agent.py``, the file RecipeAgent
  uploads; version = its VERSION. Checkable, not required: it is part of the platform's own
  source, released and tested (tests/launcher/test_synth_mini.py) with the adapters it talks
  to, so a build of it cannot drift from the platform that runs it.
* command: exempt. The recipe's command is arbitrary: the platform cannot know its harness,
  let alone script a task for it.
* oracle, nop: exempt. They never call a model, so there is nothing to capture or re-render.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path

from synth_launcher.engines import ENGINES

CHECKABLE = ("claude-code", "codex", "synth-mini")
REQUIRED_FOR_TRAINING = ("claude-code", "codex")


class HarnessUnavailable(Exception):
    """The engine's harness cannot be checked here: unknown, exempt or not installed."""


@dataclass(frozen=True)
class HarnessIdentity:
    engine: str
    version: str
    digest: str
    path: Path


_digests: dict[tuple[str, int, int], str] = {}
_digests_lock = threading.Lock()


def file_sha256(*, path: Path) -> str:
    """The file's sha256, remembered by (path, size, mtime): a Claude Code executable is
    ~200 MB and run submission asks for it."""
    info = path.stat()
    key = (str(path), info.st_size, info.st_mtime_ns)
    with _digests_lock:
        known = _digests.get(key)
    if known is not None:
        return known
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    digest = sha.hexdigest()
    with _digests_lock:
        _digests[key] = digest
    return digest


def _package_version(*, executable: Path) -> str:
    """The npm package's version: the executable lives in its package (Claude Code's
    ``bin/claude.exe``; Codex's native build in ``@openai/codex-linux-x64/vendor/...``)."""
    for parent in executable.parents:
        manifest = parent / "package.json"
        if manifest.is_file():
            try:
                return str(json.loads(manifest.read_text()).get("version", ""))
            except ValueError:
                return ""
    return ""


def _synth_mini_version(*, source: Path) -> str:
    for line in source.read_text().splitlines():
        if line.startswith("VERSION = "):
            return line.split("=", 1)[1].strip().strip("\"'")
    return ""


def harness_identity(*, engine: str) -> HarnessIdentity:
    """The build of ``engine``'s harness this installation runs (HarnessUnavailable if none)."""
    known = ENGINES.get(engine)
    if known is not None and known.host_binary is not None and engine in CHECKABLE:
        from django.conf import settings

        from apps.trials.model_access import host_binary_path

        binary = known.host_binary
        executable = host_binary_path(binary=binary)
        if executable is None:
            raise HarnessUnavailable(
                f"{binary.label} is not installed at {getattr(settings, binary.setting)} ({binary.setting}); "
                "run `npm ci` in the repository root"
            )
        return HarnessIdentity(
            engine=engine,
            version=_package_version(executable=executable),
            digest=file_sha256(path=executable),
            path=executable,
        )
    if engine == "synth-mini":
        source = ENGINES[engine].uploads[0].source  # the file RecipeAgent uploads, as it will
        return HarnessIdentity(
            engine=engine, version=_synth_mini_version(source=source), digest=file_sha256(path=source), path=source
        )
    if known is not None:
        raise HarnessUnavailable(
            f"engine {engine!r} has no harness the platform can check (checkable: {', '.join(CHECKABLE)})"
        )
    raise HarnessUnavailable(f"unknown engine {engine!r} (checkable: {', '.join(CHECKABLE)})")
