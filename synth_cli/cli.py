"""Shared command plumbing: the Typer subclass that turns expected errors into one line."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any

import httpx
import typer

from synth_cli.config import settings_load
from synth_cli.errors import CliError
from synth_cli.http import Api, transport_reason
from synth_cli.output import stdout_discard

JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="Print JSON for programs instead of tables (shapes: synth_cli/README.md)."),
]


def guarded[F: Callable[..., Any]](fn: F) -> F:
    """Run a command; an expected failure becomes `synth: <message>` on stderr + its exit code.

    Only CliError (and Ctrl-C) are caught: anything else is a bug and should show its
    traceback.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CliError as exc:
            typer.echo(f"synth: {exc.message}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except httpx.TransportError as exc:
            # Requests are mapped where they are made; this is the backstop for one that was not.
            origin = (
                f"{exc.request.url.scheme}://{exc.request.url.netloc.decode()}" if _has_request(exc) else "the server"
            )
            typer.echo(f"synth: cannot reach {origin}: {transport_reason(exc)}", err=True)
            raise typer.Exit(1) from None
        except BrokenPipeError:
            # The reader went away (`synth run list | head`): what it read was what it
            # wanted, so this is no failure and no message.
            stdout_discard()
            raise typer.Exit(0) from None
        except OSError as exc:
            # Local files: a full disk, a folder we may not write to.
            where = f"{exc.filename}: " if exc.filename else ""
            typer.echo(f"synth: {where}{exc.strerror or exc}", err=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            typer.echo("synth: interrupted", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def _has_request(exc: httpx.TransportError) -> bool:
    try:
        exc.request  # noqa: B018 -- raises RuntimeError when the error carries no request
    except RuntimeError:
        return False
    return True


class SynthTyper(typer.Typer):
    """typer.Typer whose commands all run under `guarded`."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("no_args_is_help", True)
        kwargs.setdefault("rich_markup_mode", "markdown")
        kwargs.setdefault("context_settings", {"help_option_names": ["-h", "--help"]})
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:  # type: ignore[override]
        register = super().command(*args, **kwargs)

        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            register(guarded(fn))
            return fn

        return decorator


def api_open() -> Api:
    return Api(settings_load())
