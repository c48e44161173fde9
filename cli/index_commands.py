"""``densehybrid index build``, ``search`` and ``eval``: flags in, tables out; registered by ``cli/main.py``.
The work itself is in ``index.building.build`` and ``index.building.commands``."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from densehybrid.cli.encoder_options import BuildBackend, EncoderOptions, with_encoder_options
from densehybrid.cli.errors import fail, one_of
from densehybrid.cli.first_stage_options import FirstStageOptions, with_first_stage_options
from densehybrid.cli.prompt_options import build_prompts
from densehybrid.cli.import_commands import VECTORS_DTYPE_OPTION
from densehybrid.encoder.base import SCALED_KINDS
from densehybrid.encoder.errors import EncoderError
from densehybrid.index.building import commands
from densehybrid.index.search import filters
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.errors import IndexAccessError
from densehybrid.index.evaluate import EvalInputError
from densehybrid.index.served.loading import load_index
from densehybrid.index.search.fusion import DEFAULT_METHOD, FUSION_METHODS
from densehybrid.index.building.ray_build import RayBuildError, RayOptions, RayShardEncoder
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.search_device import resolve_search_device
from densehybrid.index.search.searcher import FIRST_STAGES, Searcher, SearchError

log = logging.getLogger(__name__)
console = Console()
index_app = typer.Typer(help="Build indexes of a corpus.", no_args_is_help=True)

MILVUS_URI_HELP = "Milvus instead of --index: a Milvus Lite file (*.db) or http://host:19530"
SEARCH_DEVICE_HELP = "first stage + rerank: auto (a GPU when present), cpu (Faiss), cuda, cuda:N"
_KNOWN_ERRORS = (IndexAccessError, SearchError, EvalInputError, EncoderError, FileNotFoundError, ValueError)


_FUSION_HELP = ("dhr/fusion: how the lexical and dense parts mix (auto: the mix the index chose from its corpus; "
                "zscore, minmax: per-query normalised; adaptive: zscore with a per-query weight from each part's score distribution; "
                "rrf: reciprocal-rank fusion with k 60; lambda: raw sum; lexical, dense: one part alone); default: the index's, or lambda when --lambda is given")


@index_app.command("build")
@with_encoder_options
@with_first_stage_options
def index_build(
    corpus: Path = typer.Option(..., "--corpus", exists=True, dir_okay=False, help="BEIR corpus.jsonl (_id, title, text)"),
    out: Path = typer.Option(..., "--out", help="index directory to create (published atomically)"),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted build of the same corpus and model"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing index at --out"),
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="passages per forward"),
    shard_size: int = typer.Option(4096, "--shard-size", min=1, help="passages per shard (the resume granularity)"),
    auto_lambda: bool = typer.Option(False, "--auto-lambda", help="same as --lambda auto"),
    name: Optional[str] = typer.Option(None, "--name", help="index name (default: the directory name)"),
    fusion: str = typer.Option(DEFAULT_METHOD, "--fusion", callback=one_of(FUSION_METHODS),
                               help="dhr/fusion: the searches' default mix of the parts (in the manifest); auto: chosen from the corpus"),
    query_prompt: Optional[str] = typer.Option(None, "--query-prompt",
                                               help='put before every query at search time, e.g. "query: " (E5)'),
    passage_prompt: Optional[str] = typer.Option(None, "--passage-prompt",
                                                 help='put before every passage, e.g. "passage: " (E5)'),
    prompt: Optional[list[str]] = typer.Option(None, "--prompt", metavar="NAME=TEXT",
                                               help="a named prompt (repeatable), as sentence-transformers' prompts; "
                                                    "'query' and 'passage' are the roles' prompts"),
    default_prompt_name: Optional[str] = typer.Option(None, "--default-prompt-name",
                                                      help="the named prompt queries get (default: 'query')"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bar"),
    vectors_dtype: str = VECTORS_DTYPE_OPTION,
    field: list[str] = typer.Option([], "--field", help="keep this field of each line's metadata object as a "
                                    "filterable payload column (repeatable; type inferred: keyword, integer, float, "
                                    "bool or keyword list)"),
    fields_from_metadata: bool = typer.Option(False, "--fields-from-metadata",
                                              help="keep every field found in the metadata objects (as --field)"),
    ray: Optional[str] = typer.Option(None, "--ray", help="encode on Ray Data: local (this machine's CPUs), "
                                      "auto or ADDRESS (a running cluster); needs the [ray] extra"),
    ray_batch_size: Optional[int] = typer.Option(None, "--ray-batch-size", min=1,
                                                 help="with --ray: passages per Ray batch (whole --batch-size forwards; "
                                                      "default 4 forwards)"),
    backend: Optional[BuildBackend] = typer.Option(None, "--backend", help=BuildBackend.__doc__),
    encoder: EncoderOptions = None,
    first_stage: FirstStageOptions = None,
) -> None:
    """Encode a corpus and publish an index (manifest, vectors, uint8 gates, SQLite texts)."""
    if not encoder.model:
        raise typer.BadParameter("--model is required")
    if ray_batch_size is not None and not ray:
        raise typer.BadParameter("--ray-batch-size needs --ray")
    options = BuildOptions(batch_size=batch_size, shard_size=shard_size, resume=resume, overwrite=overwrite,
                           lam="auto" if auto_lambda or encoder.lambda_auto else encoder.config.lam, ann=first_stage.ann,
                           name=name, progress=not no_progress, fusion_method=fusion,
                           prompts=build_prompts(query_prompt, passage_prompt, prompt, default_prompt_name),
                           fields=tuple(field), fields_from_metadata=fields_from_metadata, values_dtype=vectors_dtype,
                           target_recall=first_stage.target_recall,
                           calibration_queries=first_stage.calibration_queries)
    try:
        model = commands.load_model(encoder.config, encoder.device, backend=backend and backend.value,
                                    precision=encoder.precision)
        start = time.perf_counter()
        if ray:
            with RayShardEncoder(model, encoder.config, encoder.device, batch_size,
                                 RayOptions(ray, ray_batch_size)) as encode_shard:
                build_index(model, corpus, out, options, encode_shard=encode_shard, engine=encode_shard.record())
        else:
            build_index(model, corpus, out, options)
        seconds = time.perf_counter() - start
        index = load_index(out)
    except (*_KNOWN_ERRORS, RayBuildError) as exc:
        fail(exc)
    console.print(f"built {out}: {index.count} passages in {seconds:.1f} s ({index.count / seconds:.1f} passages/s), "
                  f"kind {index.spec.kind}, dim {index.spec.dim}, λ = {index.lam:.4g} ({index.manifest['lambda']['method']})"
                  + (f", fusion auto: {mix}" if (mix := commands.chosen_mix(index)) else ""))


def _open(index_dir: Optional[Path], milvus_uri: Optional[str], collection: Optional[str]):
    """The index named on the command line: a directory, or a Milvus collection."""
    if milvus_uri or collection:
        if index_dir is not None or not (milvus_uri and collection):
            fail("give either --index DIR or both --milvus-uri URI and --collection NAME")
        from densehybrid.index.served.milvus import open_collection

        return open_collection(milvus_uri, collection)
    if index_dir is None:
        fail("--index DIR (or --milvus-uri URI --collection NAME) is required")
    return load_index(index_dir)


def _parse_filter(text: str, field_types: dict[str, str]):
    try:
        return filters.parse(json.loads(text), field_types)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"--filter is not JSON ({exc})") from None
    except filters.FilterError as exc:
        raise typer.BadParameter(f"--{exc}") from None


@with_encoder_options
def search(
    query: str = typer.Argument(..., help="query text"),
    index_dir: Optional[Path] = typer.Option(None, "--index", help="index directory"),
    milvus_uri: Optional[str] = typer.Option(None, "--milvus-uri", help=MILVUS_URI_HELP),
    collection: Optional[str] = typer.Option(None, "--collection", help="Milvus collection (with --milvus-uri)"),
    k: int = typer.Option(10, "-k", "--k", min=1, help="results to show"),
    first_stage: str = typer.Option("ip", "--first-stage", callback=one_of(FIRST_STAGES), help="ip or approx_gip"),
    candidates: int = typer.Option(1000, "--candidates", min=1, help="first-stage depth K1"),
    theta: float = typer.Option(0.1, "--theta", help="approx_gip: query dims above θ take part"),
    no_rerank: bool = typer.Option(False, "--no-rerank", help="first-stage scores only"),
    search_device: str = typer.Option("auto", "--search-device", help=SEARCH_DEVICE_HELP),
    fusion: Optional[str] = typer.Option(None, "--fusion", callback=one_of(FUSION_METHODS), help=_FUSION_HELP),
    filter_json: Optional[str] = typer.Option(None, "--filter", help='a filter over the index\'s fields, as /search '
                                              'takes it, e.g. \'{"field": "kind", "eq": "class"}\''),
    encoder: EncoderOptions = None,
) -> None:
    """Search an index with one query; prints rank, id, score, a snippet and the stage times.

    The model is the one the index records unless --model is given (it must match the index).
    """
    try:
        index = _open(index_dir, milvus_uri, collection)
        model = commands.encoder_for_index(index, encoder.config, encoder.device, precision=encoder.precision)
        params = SearchParams(k=k, first_stage=first_stage, candidates=candidates, theta=theta, rerank=not no_rerank,
                              lam=encoder.fixed_lambda("search"), method=fusion,
                              filter=None if filter_json is None else _parse_filter(filter_json, index.field_types))
        searcher = Searcher(index, device=resolve_search_device(search_device, index))
        found = commands.search_texts(model, searcher, [query], params)
    except _KNOWN_ERRORS as exc:
        fail(exc)
    table = Table("rank", "id", "score", "snippet", title=f"{index.name} ({index.spec.kind}, {index.count} passages)")
    for rank, (doc, doc_id, score) in enumerate(zip(index.docs.get_many(found.ids[0]), found.ids[0], found.scores[0]), 1):
        text = "" if doc is None else f"{doc.title} {doc.text}".strip()
        table.add_row(str(rank), doc_id, f"{score:.4f}", text[:100] + ("…" if len(text) > 100 else ""))
    console.print(table)
    console.print("  ".join(f"{key} {value:.2f}" for key, value in found.timing.items()))


@with_encoder_options
def eval_command(
    index_dir: Optional[Path] = typer.Option(None, "--index", help="index directory"),
    milvus_uri: Optional[str] = typer.Option(None, "--milvus-uri", help=MILVUS_URI_HELP),
    collection: Optional[str] = typer.Option(None, "--collection", help="Milvus collection (with --milvus-uri)"),
    queries: Path = typer.Option(..., "--queries", exists=True, dir_okay=False, help="BEIR queries.jsonl"),
    qrels: Path = typer.Option(..., "--qrels", exists=True, dir_okay=False, help="qrels (BEIR or TREC columns, header optional)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object: nDCG@10, MRR@10, R@100, R@1000"),
    run: Optional[Path] = typer.Option(None, "--run", help="also write a TREC run file"),
    first_stage: str = typer.Option("ip", "--first-stage", callback=one_of(FIRST_STAGES), help="ip or approx_gip"),
    candidates: int = typer.Option(1000, "--candidates", min=1, help="first-stage depth K1"),
    theta: float = typer.Option(0.1, "--theta", help="approx_gip: query dims above θ take part"),
    no_rerank: bool = typer.Option(False, "--no-rerank", help="first-stage scores only (no exact GIP)"),
    bm25: bool = typer.Option(False, "--bm25", help="evaluate BM25 (bm25s) over the index's passages instead"),
    search_device: str = typer.Option("auto", "--search-device", help=SEARCH_DEVICE_HELP),
    fusion: Optional[str] = typer.Option(None, "--fusion", callback=one_of(FUSION_METHODS), help=_FUSION_HELP),
    compare_fusion: bool = typer.Option(False, "--compare-fusion",
                                        help="dhr/fusion: one row per method (each part, auto, lambda, zscore, minmax, adaptive, rrf)"),
    encoder: EncoderOptions = None,
) -> None:
    """nDCG@10, MRR@10, R@100 and R@1000 of an index (or of BM25 over its passages) on judged queries.

    A fused index (dhr, fusion) also gets a row for each part alone, in the same table.
    """
    try:
        index = _open(index_dir, milvus_uri, collection)
        model = None if bm25 else commands.encoder_for_index(index, encoder.config, encoder.device,
                                                                 precision=encoder.precision)
        device = resolve_search_device(search_device, index)
        params = SearchParams(k=1000, first_stage=first_stage, candidates=candidates, theta=theta,
                              lam=encoder.fixed_lambda("eval"), rerank=not no_rerank, method=fusion)
        if compare_fusion:
            if bm25 or no_rerank or index.spec.kind not in SCALED_KINDS:
                raise typer.BadParameter("--compare-fusion needs a fused index (dhr, fusion), the rerank and no --bm25")
            outcomes = commands.fusion_comparison(index, queries, qrels, encoder=model, device=device, params=params)
        elif as_json:  # the asked-for system only, as before
            outcomes = {"": commands.run_eval(index, queries, qrels, encoder=model, bm25=bm25, run_path=run,
                                              device=device, params=params)}
        else:
            outcomes = commands.eval_rows(index, queries, qrels, encoder=model, bm25=bm25, run_path=run,
                                          device=device, params=params)
    except _KNOWN_ERRORS as exc:
        fail(exc)
    last = list(outcomes.values())[-1]
    if as_json:
        typer.echo(json.dumps({what: o.metrics for what, o in outcomes.items()} if compare_fusion else last.metrics))
        return
    table = Table("system", *last.metrics, title=f"{index.name}: {last.queries} judged queries")
    for what, outcome in outcomes.items():
        label = f"auto ({commands.chosen_mix(index) or 'none chosen: zscore'})" if what == "auto" else what
        table.add_row(label, *(f"{v:.4f}" for v in outcome.metrics.values()))
    console.print(table)
    console.print("  ".join(f"{key} {value:.1f}" for key, value in last.timing.items()))


@index_app.command("export")
def index_export(
    index_dir: Path = typer.Option(..., "--index", help="a built index directory (exact flat_ip first stage)"),
    milvus_uri: str = typer.Option(..., "--milvus-uri", help="a Milvus Lite file (*.db) or http://host:19530"),
    collection: str = typer.Option(..., "--collection", help="collection name (letters, digits, underscores)"),
    batch_size: int = typer.Option(1000, "--batch-size", min=1, help="rows per upsert (the resume granularity)"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bar"),
) -> None:
    """Copy an index into Milvus; re-running resumes an interrupted export and never duplicates rows."""
    from tqdm.auto import tqdm

    from densehybrid.index.served.milvus_export import export_index

    try:
        index = load_index(index_dir)
        with tqdm(total=index.count, unit="row", desc=f"export {index.name}", disable=no_progress) as bar:
            report = export_index(index, milvus_uri, collection, batch_size=batch_size, progress=bar.update)
    except _KNOWN_ERRORS as exc:
        fail(exc)
    resumed = f" (resumed at row {report.resumed_from})" if report.resumed_from else ""
    console.print(f"exported {index_dir} to {milvus_uri} collection {collection}: {report.rows} rows{resumed}")


def register(app: typer.Typer) -> None:
    app.add_typer(index_app, name="index")
    app.command("search")(search)
    app.command("eval")(eval_command)
