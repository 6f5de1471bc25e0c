"""The errors of the local sandbox."""

from __future__ import annotations


class SandboxError(RuntimeError):
    """The sandbox could not be created or used."""


class SandboxUnavailableError(SandboxError):
    """This host lacks something the local sandbox needs (bubblewrap, util-linux, ...)."""


class SandboxPathError(ValueError):
    """A container path is outside the sandbox's writable directories."""


class SandboxExecTimeoutError(RuntimeError):
    """An exec ran past its timeout; all its processes were killed."""

    def __init__(self, timeout_sec: float, stdout: str, stderr: str) -> None:
        # Same wording as Harbor's docker provider, which callers may match on.
        super().__init__(f"Command timed out after {timeout_sec} seconds")
        self.timeout_sec = timeout_sec
        self.stdout = stdout
        self.stderr = stderr
