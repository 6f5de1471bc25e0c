"""Output: rich tables for people, plain JSON for programs, a spinner only for a terminal.

Standard output carries the result (a table, an id, or JSON); everything else (notes,
spinners, errors) goes to standard error, so `RUN=$(synth run start ...)` and
`synth run list --json | jq` work.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table


def stdout_discard() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush into a closed
    pipe does not fail again on the way out."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass  # not a real file (a test's captured output): nothing will flush into a pipe


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich exits 1 here; a reader that went away (`| head`) is no failure of ours.
        self.quiet = True
        stdout_discard()
        raise typer.Exit(0)


class Ui:
    def __init__(self, *, json_mode: bool) -> None:
        self.json_mode = json_mode
        # Not a terminal (a pipe, a file, a test): no colour, and wide enough that ids and
        # digests are not folded mid-token.
        tty = sys.stdout.isatty()
        self.out = _Console(highlight=False, width=None if tty else 200, no_color=not tty)
        self.err = Console(stderr=True, highlight=False)

    # ------------------------------------------------------------------ JSON

    def emit_json(self, value: Any) -> None:
        typer.echo(json.dumps(value, indent=2, ensure_ascii=False))

    def emit_json_line(self, value: Any) -> None:
        """One compact object per line (JSON Lines), flushed: for streams such as events."""
        typer.echo(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
        sys.stdout.flush()

    # ------------------------------------------------------------------ human

    def line(self, text: str) -> None:
        """A plain result line on stdout (not rich markup: ids may hold brackets)."""
        typer.echo(text)

    def note(self, text: str) -> None:
        """Context for a person on stderr after a success; silent with --json."""
        if not self.json_mode:
            typer.echo(text, err=True)

    def warn(self, text: str) -> None:
        """Something the user should know although the command succeeded: on stderr, also
        with --json (whose stdout stays the result alone)."""
        typer.echo(f"warning: {text}", err=True)

    def progress(self, text: str) -> None:
        """A step on the way, on a terminal only: a failure that follows stays one line."""
        if not self.json_mode and sys.stderr.isatty():
            typer.echo(text, err=True)

    def table(self, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None) -> None:
        table = Table(title=title, title_justify="left", header_style="bold", box=None, pad_edge=False)
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(escape(cell_text(cell)) for cell in row))
        self.out.print(table)

    def fields(self, pairs: Iterable[tuple[str, Any]]) -> None:
        """A two-column key/value view of one object."""
        table = Table(show_header=False, box=None, pad_edge=False)
        table.add_column(style="bold")
        table.add_column(overflow="fold")
        for key, value in pairs:
            table.add_row(escape(key), escape(cell_text(value)))
        self.out.print(table)

    @contextmanager
    def status(self, message: str) -> Iterator[None]:
        """A spinner while waiting on the server: only on a terminal, never with --json."""
        if self.json_mode or not sys.stderr.isatty():
            with nullcontext():
                yield
            return
        with self.err.status(escape(message)):
            yield


def cell_text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")) if value else "-"
    return str(value)


def time_short(value: Any) -> str | None:
    """'2026-05-01T12:00:03.123456Z' -> '2026-05-01 12:00:03'."""
    if not isinstance(value, str) or "T" not in value:
        return value
    date, _, rest = value.partition("T")
    return f"{date} {rest[:8]}"


def digest_short(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    hexpart = value.removeprefix("sha256:")
    return f"sha256:{hexpart[:12]}"


def profile_ref_text(ref: Any) -> str | None:
    if not isinstance(ref, dict):
        return None
    text = f"{ref.get('profile')}@{ref.get('version')}"
    return f"{text} ({digest_short(ref.get('digest'))})" if ref.get("digest") else text
