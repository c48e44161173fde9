"""``densehybrid index import`` (a Pyserini Faiss index, without re-encoding) and ``index verify`` (every sha256).

The work is in ``index.building.importing`` and ``index.storage.files``; this module parses flags and prints.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from densehybrid.cli.encoder_options import EncoderOptions, with_encoder_options
from densehybrid.cli.errors import fail, one_of
from densehybrid.cli.first_stage_options import FirstStageOptions, with_first_stage_options
from densehybrid.encoder.errors import EncoderError
from densehybrid.index.building import commands
from densehybrid.index.building.importing import ImportOptions, import_pyserini
from densehybrid.index.errors import IndexAccessError
from densehybrid.index.served.loading import load_index, verify_index
from densehybrid.index.storage.vectors import DTYPES

console = Console()


VECTORS_DTYPE_OPTION = typer.Option(
    "float16", "--vectors-dtype", callback=one_of(DTYPES),
    help="element type of the one stored copy of the vectors, read by the exact first stage and the rerank "
         "(float16: half the disk and memory; float32: the encoder's values as they are)")


@with_encoder_options
@with_first_stage_options
def index_import(
    source: Path = typer.Argument(..., help="a Pyserini Faiss index directory: 'index' (IndexFlatIP) and 'docid'"),
    out: Path = typer.Option(..., "--out", help="index directory to create (published atomically)"),
    corpus: Optional[Path] = typer.Option(None, "--corpus", exists=True, dir_okay=False,
                                          help="BEIR corpus.jsonl with the passages' texts (and metadata fields)"),
    vectors_dtype: str = VECTORS_DTYPE_OPTION,
    name: Optional[str] = typer.Option(None, "--name", help="index name (default: the directory name)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing index at --out"),
    field: list[str] = typer.Option([], "--field", help="keep this metadata field of the corpus as a filterable "
                                    "payload column (repeatable; needs --corpus in docid order)"),
    fields_from_metadata: bool = typer.Option(False, "--fields-from-metadata",
                                              help="keep every metadata field found in the corpus (as --field)"),
    encoder: EncoderOptions = None,
    first_stage: FirstStageOptions = None,
) -> None:
    """Turn a Pyserini Faiss index (vectors + docid) into an index, without re-encoding.

    The model flags name the query encoder the vectors were made with (as for index build);
    its dims must match the vectors'. ``--precision`` names the precision they were encoded in:
    the calibration's queries are encoded in it, and ``serve`` expects it."""
    if not encoder.model:
        raise typer.BadParameter("--model is required (the query encoder matching the vectors)")
    options = ImportOptions(corpus=corpus, values_dtype=vectors_dtype, name=name, overwrite=overwrite,
                            ann=first_stage.ann,
                            fields=tuple(field), fields_from_metadata=fields_from_metadata,
                            target_recall=first_stage.target_recall, calibration_queries=first_stage.calibration_queries)
    try:
        model = commands.load_model(encoder.config, encoder.device, precision=encoder.precision)
        start = time.perf_counter()
        import_pyserini(source, out, model.spec, options, encoder=model)
        index = load_index(out)
    except (IndexAccessError, EncoderError, ValueError, FileNotFoundError) as exc:
        fail(exc)
    console.print(f"imported {source} into {out}: {index.count} passages of {index.spec.dim} dims "
                  f"({vectors_dtype}) in {time.perf_counter() - start:.1f} s, kind {index.spec.kind}")


def index_verify(index_dir: Path = typer.Argument(..., help="index directory")) -> None:
    """Check every file of an index against the sha256 its manifest recorded (reads the whole index)."""
    start = time.perf_counter()
    try:
        manifest = verify_index(index_dir)
    except IndexAccessError as exc:
        fail(exc)
    total = sum(meta["bytes"] for meta in manifest["files"].values())
    console.print(f"{index_dir}: {len(manifest['files'])} files, {total / 2**30:.2f} GiB, every sha256 matches "
                  f"({time.perf_counter() - start:.1f} s)")


def register(index_app: typer.Typer) -> None:
    index_app.command("import")(index_import)
    index_app.command("verify")(index_verify)
