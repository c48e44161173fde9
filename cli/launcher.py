"""The ``densehybrid`` entry point: the runtime-extra check, before any command module is imported.

The command modules import Faiss and ONNX Runtime at module level, so without ``densehybrid[cpu]`` or
``densehybrid[gpu]`` importing them fails before a typer callback could run. Checking here turns that
into one sentence naming both installs. ``models list`` and ``models fetch`` need neither library and
run without an extra.
"""

from __future__ import annotations

import sys

from densehybrid.cli.errors import print_error
from densehybrid.encoder.extras import MissingExtraError, installed_extra

NEEDS_NO_EXTRA = {("models", "list"), ("models", "fetch")}


def command_words(args: list[str]) -> tuple[str, ...]:
    """The command and subcommand named on the line (options left out)."""
    return tuple(arg for arg in args if not arg.startswith("-"))[:2]


def main() -> None:
    if command_words(sys.argv[1:]) in NEEDS_NO_EXTRA:
        import typer

        from densehybrid.cli.models_commands import models_app

        models_only = typer.Typer()
        models_only.add_typer(models_app, name="models")
        models_only(prog_name="densehybrid")
        return
    try:
        installed_extra()
    except MissingExtraError as exc:
        print_error(str(exc))
        sys.exit(2)
    from densehybrid.cli.main import main as run_command

    run_command()
