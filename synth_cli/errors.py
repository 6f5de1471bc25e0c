"""Expected failures of a command, each with its exit code and a one-line message.

Exit codes (the contract for scripts): 0 success, 1 a failed operation (the server said
no, a download did not verify, a followed run failed), 2 bad usage (malformed reference,
unreadable or invalid JSON file). Typer's own usage errors also exit 2.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(Exception):
    """An expected failure: printed as one `synth: <message>` line, never a traceback."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        # Collapse whitespace so the message is one line whatever the server sent.
        super().__init__(" ".join(str(message).split()))
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self)


class UsageError(CliError):
    """The command line (or a file it names) is wrong; nothing was sent."""

    exit_code = EXIT_USAGE


class ApiError(CliError):
    """The server answered with an error status."""

    def __init__(self, message: str, *, status: int, error_type: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.field = field


class Unreachable(CliError):
    """No HTTP answer at all: connection refused, DNS failure, timeout."""
