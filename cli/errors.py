"""How every command stops on an error it expected: one sentence, exit code 2, no traceback."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

console = Console()


def sentence(exc: Exception) -> str:
    """The exception as one line; pydantic's multi-line report becomes 'field: problem; ...'."""
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(part) for part in error['loc']) or 'value'}: {error['msg']}"
                         for error in exc.errors())
    return str(exc)


def print_error(text: str) -> None:
    """Print ``error: <text>`` (Rich markup in it printed as is)."""
    console.print(f"[red]error:[/red] {escape(text)}", soft_wrap=True)


def one_of(choices: Sequence[str]):
    """A typer callback that refuses a value outside ``choices`` (an option left unset passes)."""
    def check(value: str | None) -> str | None:
        if value is not None and value not in choices:
            raise typer.BadParameter(f"one of {', '.join(choices)}")
        return value
    return check


def fail(message: str | Exception) -> NoReturn:
    """Print ``error: <message>`` and exit with code 2."""
    print_error(sentence(message) if isinstance(message, Exception) else message)
    raise typer.Exit(2)
