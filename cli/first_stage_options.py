"""The first-stage flags of the commands that write an index (``index build``, and any import of vectors).

``--ann flat`` (the default) keeps the exact scan; ``--ann hnsw`` writes a Faiss HNSW graph beside the
exact rows and ``--ann pqscan`` 4-bit product codes of every row, each searched first and its candidates
rescored exactly. The build calibrates an approximate first stage's breadth to ``--target-recall``::

    @index_app.command("build")
    @with_first_stage_options
    def build(corpus: Path, first_stage: FirstStageOptions) -> None:
        BuildOptions(ann=first_stage.ann)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from densehybrid.cli.errors import one_of
from densehybrid.cli.settings_flags import replace_parameter
from densehybrid.index.building.first_stage import AnnConfig
from densehybrid.index.engines.hnsw_engine import ENCODINGS, METRICS, HNSWConfig
from densehybrid.index.engines.pqscan_engine import MAX_MARGIN, MAX_RESCORE, PQScanConfig
from densehybrid.index.building.calibration import DEFAULT_TARGET

ANN_CHOICES = ("flat", "hnsw", "pqscan")
_DEFAULT = HNSWConfig()
_DEFAULT_PQSCAN = PQScanConfig()


@dataclass(frozen=True)
class FirstStageOptions:
    """``ann``: the approximate first stage (None: the exact flat scan)."""

    ann: AnnConfig | None = None
    # the recall@10 an approximate first stage's default breadth is calibrated to (None: keep the breadth given)
    target_recall: float | None = DEFAULT_TARGET
    calibration_queries: Path | None = None  # a BEIR queries.jsonl to calibrate on, instead of cut passages


def _options(ann: str, hnsw_m: int, ef_construction: int, ef_search: int | None, hnsw_codes: str,
             hnsw_metric: str, pqscan_margin: float | None, rescore: int, target_recall: float,
             calibration_queries: Path | None) -> FirstStageOptions:
    if ann == "flat":
        return FirstStageOptions()
    breadth = {"hnsw": ef_search, "pqscan": pqscan_margin}[ann]
    # a breadth given is kept (and measured); else the build makes the one that keeps the target the default
    calibrated = {"target_recall": None if breadth is not None else (target_recall or None),
                  "calibration_queries": calibration_queries}
    if ann == "pqscan":
        return FirstStageOptions(ann=PQScanConfig(rescore=rescore, margin=_DEFAULT_PQSCAN.margin if pqscan_margin is None
                                                  else pqscan_margin), **calibrated)
    return FirstStageOptions(ann=HNSWConfig(m=hnsw_m, ef_construction=ef_construction,
                                            ef_search=ef_search or _DEFAULT.ef_search, encoding=hnsw_codes,
                                            metric=hnsw_metric),
                             **calibrated)


_FLAGS = [  # (parameter, type, default, flag)
    ("ann", str, "flat", typer.Option("--ann", callback=one_of(ANN_CHOICES),
                                      help="first stage: flat (exact scan), hnsw (a Faiss HNSW graph) or "
                                           "pqscan (4-bit product codes of every row, scanned); the candidates "
                                           "of hnsw and pqscan are rescored exactly")),
    ("hnsw_m", int, _DEFAULT.m, typer.Option("--hnsw-m", min=2, max=256, help="--ann hnsw: links per node")),
    ("ef_construction", int, _DEFAULT.ef_construction, typer.Option("--ef-construction", min=1, max=4096,
                                                                    help="--ann hnsw: graph breadth while building")),
    ("ef_search", Optional[int], None, typer.Option("--ef-search", min=1, max=10_000,
                                                    help="--ann hnsw: the searches' default graph breadth (a request's "
                                                         "ef_search overrides it); default: the one that keeps "
                                                         "--target-recall")),
    ("hnsw_codes", str, _DEFAULT.encoding, typer.Option("--hnsw-codes", callback=one_of(ENCODINGS),
                                                        help="--ann hnsw: how the graph stores vectors: sq8 "
                                                             "(1 byte a dim) or fp16 (2 bytes)")),
    ("hnsw_metric", str, _DEFAULT.metric, typer.Option(
        "--hnsw-metric", callback=one_of(METRICS),
        help="--ann hnsw: how the graph links rows: inner_product, or l2_augmented (L2 over each row with one "
             "more dim, as graphs were built before; on rows of unequal norms, as the DLR and fusion kinds' are, "
             "it found far fewer of the exact top 10)")),
    ("pqscan_margin", Optional[float], None, typer.Option(
        "--pqscan-margin", min=0.0, max=MAX_MARGIN,
        help="--ann pqscan: the searches' default margin: candidates whose code score is within it (x |query|) of "
             "the k-th best are rescored exactly (a request's margin overrides it); default: the margin that keeps "
             "--target-recall")),
    ("rescore", int, _DEFAULT_PQSCAN.rescore, typer.Option("--rescore", min=1, max=MAX_RESCORE,
                                                           help="--ann pqscan: the least candidates rescored per "
                                                                "query, whatever the margin")),
    ("target_recall", float, DEFAULT_TARGET, typer.Option(
        "--target-recall", min=0.0, max=1.0,
        help="--ann hnsw/pqscan: the recall@10 to keep: the build measures it on held-out queries at each "
             "breadth and makes the cheapest one that keeps it the default (a breadth given with --ef-search "
             "or --pqscan-margin is kept instead, and measured all the same; 0: the engine's default "
             "breadth)")),
    ("calibration_queries", Optional[Path], None, typer.Option(
        "--calibration-queries", exists=True, dir_okay=False,
        help="--ann hnsw/pqscan: a BEIR queries.jsonl (_id, text) to calibrate on (default: sentences cut "
             "from sampled passages, their rows held out of the first stage while measured, and sentences of "
             "Python's own docstrings, another domain; the recall stated is the lower group's)")),
]


def with_first_stage_options(command):
    """Decorate a typer command taking ``first_stage: FirstStageOptions`` to expose the flags above."""
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                               annotation=Annotated[kind, option]) for name, kind, default, option in _FLAGS]
    return replace_parameter(command, "first_stage", added, lambda flags: _options(**flags))
