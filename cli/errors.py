"""How every command stops on an error it expected: one sentence, exit code 2, no traceback."""

from __future__ import annotations

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


def fail(message: str | Exception) -> NoReturn:
    """Print ``error: <message>`` (Rich markup in it printed as is) and exit with code 2."""
    text = sentence(message) if isinstance(message, Exception) else message
    console.print(f"[red]error:[/red] {escape(text)}", soft_wrap=True)
    raise typer.Exit(2)
