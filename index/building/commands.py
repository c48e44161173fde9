"""What the ``index build``, ``search`` and ``eval`` commands do, without the printing.

The CLI (``cli/index_commands.py``) parses flags and prints; these functions load,
encode, search and measure, so that tests and scripts can call them directly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from densehybrid.encoder.base import SCALED_KINDS, Encoded, Encoder
from densehybrid.encoder.batches import encode_in_batches
from densehybrid.encoder.config import EncoderConfig
from densehybrid.index import evaluate
from densehybrid.index.storage.compatibility import check_compatible
from densehybrid.index.served.local import IndexFiles
from densehybrid.index.search import identifiers
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.mix import resolve_method
from densehybrid.index.search.searcher import Searcher, SearchResults

log = logging.getLogger(__name__)

def load_model(config: EncoderConfig, device: str | None = None, *, backend: str | None = None,
               precision: str | None = None) -> Encoder:
    """The one place the commands load a model (tests swap it for a fake encoder with a fixture).

    ``precision`` None: fp32; ``backend`` None: torch, or ONNX Runtime for int8 (the only runtime that has it)."""
    from densehybrid.encoder.loading import load_encoder

    precision = precision or "fp32"
    backend = backend or ("onnx" if precision == "int8" else "torch")
    return load_encoder(config, device=device, backend=backend, precision=precision)


def encoder_for_index(index: IndexFiles, config: EncoderConfig = EncoderConfig(), device: str | None = None, *,
                      precision: str | None = None) -> Encoder:
    """The model ``config`` names (as configured there), else the one the manifest records; checked against the index.
    Queries are encoded in ``precision``, else in the precision of the index's passages."""
    encoder = load_model(config if config.model else EncoderConfig.from_spec(index.spec), device,
                         precision=precision or index.encoded_precision)
    check_compatible(index.spec, encoder.spec)
    return encoder


def _search_batches(searcher: Searcher, batches: Iterable[Encoded], params: SearchParams,
                    timing: dict[str, float]) -> SearchResults:
    """Search each batch of encoded queries in turn; the results' timing is ``timing`` plus the summed
    search_ms/rerank_ms."""
    ids, scores, rows = [], [], []
    timing |= {"search_ms": 0.0, "rerank_ms": 0.0}
    for encoded in batches:
        found = searcher.search(encoded, params)
        ids += found.ids
        scores += found.scores
        rows += found.rows
        for key in ("search_ms", "rerank_ms"):
            timing[key] += found.timing[key]
    return SearchResults(ids, scores, rows, timing)


def search_texts(encoder: Encoder, searcher: Searcher, texts: list[str], params: SearchParams = SearchParams(), *,
                 batch_size: int = 64) -> SearchResults:
    """Encode and search ``texts`` in batches; timing sums encode_ms/search_ms/rerank_ms over batches."""
    prompt = searcher.index.prompts.for_role("query")  # the index's query prompt, as /search applies it
    start = time.perf_counter()
    batches = [b.encoded for b in encode_in_batches(encoder, [prompt + text for text in texts], "query", batch_size)]
    timing = {"encode_ms": (time.perf_counter() - start) * 1000}
    if not identifiers.applies(searcher.index, params, texts):
        return _search_batches(searcher, batches, params, timing)
    # an identifier's holders first, as /search ranks them
    found = _search_batches(searcher, batches, identifiers.widened(params, searcher.index.count), timing)
    return identifiers.holders_first_page(found, texts, searcher.index.get_many, params.offset, params.k)[0]


@dataclass
class EvalOutcome:
    metrics: dict[str, float]
    queries: int
    timing: dict[str, float]


def run_eval(index: IndexFiles, queries_path: Path, qrels_path: Path, *, encoder: Encoder | None, bm25: bool = False,
             run_path: Path | None = None, device: str = "cpu",
             params: SearchParams = SearchParams(k=1000)) -> EvalOutcome:
    """Evaluate the index's model (or BM25 over the index's passages) on the judged queries, to depth ``params.k``."""
    qids, texts, qrels = evaluate.read_judged(queries_path, qrels_path)
    start = time.perf_counter()
    if bm25:
        docs = list(index.docs.iter_rows())
        ids, scores = evaluate.bm25_search([d.id for d in docs], [f"{d.title} {d.text}".strip() for d in docs], texts,
                                           params.k)
        timing = {"total_ms": (time.perf_counter() - start) * 1000}
        tag = "bm25"
    else:
        found = search_texts(encoder, Searcher(index, device=device), texts, params)
        ids, scores, timing = found.ids, found.scores, found.timing
        tag = f"densehybrid-{index.spec.kind}"
    if run_path is not None:
        evaluate.write_trec_run(run_path, qids, ids, scores, tag)
    metrics = evaluate.evaluate(evaluate.to_run(qids, ids, scores), qrels)
    return EvalOutcome(metrics, len(qids), timing)


def eval_rows(index: IndexFiles, queries_path: Path, qrels_path: Path, *, encoder: Encoder | None, bm25: bool = False,
              run_path: Path | None = None, device: str = "cpu",
              params: SearchParams = SearchParams(k=1000)) -> dict[str, EvalOutcome]:
    """The rows ``eval`` prints: the system asked for and, for a fused index, each part alone.

    -> {label: outcome}, the asked-for system last (the run file, if any, is its run).
    """
    rows: dict[str, EvalOutcome] = {}
    if not bm25 and index.spec.kind in SCALED_KINDS:
        for part in ("lexical", "dense"):
            rows[f"{part} part alone"] = run_eval(index, queries_path, qrels_path, encoder=encoder, device=device,
                                                  params=params.but(method=part))
        chosen = resolve_method(index, params.method, params.lam)
        label = f"fusion ({chosen}" + (f", λ = {params.lam or index.lam:.4g})" if chosen == "lambda" else ")")
    else:
        label = "BM25" if bm25 else f"{index.spec.kind} ({index.spec.model_id})"
    rows[label] = run_eval(index, queries_path, qrels_path, encoder=encoder, bm25=bm25, run_path=run_path,
                           device=device, params=params)
    return rows


def chosen_mix(index: IndexFiles) -> str:
    """"zscore, dense weight 0.7": the mix a fused index chose from its corpus at build; "" if it chose none."""
    if "auto" not in index.manifest.get("fusion", {}):
        return ""
    method, weight = index.auto_mix
    return f"{method}, dense weight {weight:.1f}"


COMPARED_METHODS = ("lexical", "dense", "auto", "lambda", "zscore", "minmax", "adaptive", "rrf")


def fusion_comparison(index: IndexFiles, queries_path: Path, qrels_path: Path, *, encoder: Encoder,
                      device: str = "cpu", batch_size: int = 64,
                      params: SearchParams = SearchParams(k=1000)) -> dict[str, EvalOutcome]:
    """Every fusion method (``COMPARED_METHODS``) of a fused index on the same judged queries, encoded once.

    -> {method: outcome}; ``lambda`` uses the given λ, else the index's; ``auto`` the index's chosen mix
    and the fixed normalised methods their fixed dense weight (the manifest's ``dense_weight``).
    """
    qids, texts, qrels = evaluate.read_judged(queries_path, qrels_path)
    start = time.perf_counter()
    prompt = index.prompts.for_role("query")
    batches = [encoder.encode(texts[s:s + batch_size], "query", prompt=prompt) for s in range(0, len(texts), batch_size)]
    encode_ms = (time.perf_counter() - start) * 1000
    searcher = Searcher(index, device=device)
    rows: dict[str, EvalOutcome] = {}
    for method in COMPARED_METHODS:
        found = _search_batches(searcher, batches, params.but(method=method), {"encode_ms": encode_ms})
        metrics = evaluate.evaluate(evaluate.to_run(qids, found.ids, found.scores), qrels)
        rows[method] = EvalOutcome(metrics, len(qids), found.timing)
    return rows
