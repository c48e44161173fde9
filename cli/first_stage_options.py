"""The first-stage flags of the commands that write an index (``index build``, and any import of vectors).

``--ann flat`` (the default) keeps the exact scan, or ``IndexPQ`` with ``--pq M``; ``--ann hnsw``
writes a Faiss HNSW graph beside the exact rows, searched first and rescored exactly::

    @index_app.command("build")
    @with_first_stage_options
    def build(corpus: Path, first_stage: FirstStageOptions) -> None:
        BuildOptions(pq=first_stage.pq, ann=first_stage.ann)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated

import typer

from densehybrid.cli.errors import one_of
from densehybrid.cli.settings_flags import replace_parameter
from densehybrid.index.engines.faiss_engine import PQConfig
from densehybrid.index.engines.hnsw_engine import ENCODINGS, HNSWConfig

ANN_CHOICES = ("flat", "hnsw")
_DEFAULT = HNSWConfig()


@dataclass(frozen=True)
class FirstStageOptions:
    """At most one of ``pq`` and ``ann`` (None, None: the exact flat scan)."""

    pq: PQConfig | None = None
    ann: HNSWConfig | None = None


def _options(ann: str, pq_m: int, pq_nbits: int, hnsw_m: int, ef_construction: int, ef_search: int,
             hnsw_codes: str) -> FirstStageOptions:
    if ann == "flat":
        return FirstStageOptions(pq=PQConfig(pq_m, pq_nbits) if pq_m else None)
    if pq_m:
        raise typer.BadParameter("--pq is a first stage of its own: use it with --ann flat, or leave it out "
                                 "for --ann hnsw", param_hint="--pq")
    return FirstStageOptions(ann=HNSWConfig(m=hnsw_m, ef_construction=ef_construction, ef_search=ef_search,
                                            encoding=hnsw_codes))


_FLAGS = [  # (parameter, type, default, flag)
    ("ann", str, "flat", typer.Option("--ann", callback=one_of(ANN_CHOICES),
                                      help="first stage: flat (exact scan, or IndexPQ with --pq) or hnsw "
                                           "(a Faiss HNSW graph, its candidates rescored exactly)")),
    ("pq_m", int, 0, typer.Option("--pq", min=0, help="with --ann flat: IndexPQ first stage with this many "
                               "sub-quantizers (0: exact FlatIP)")),
    ("pq_nbits", int, 8, typer.Option("--pq-nbits", min=1, max=16, help="bits per PQ sub-quantizer")),
    ("hnsw_m", int, _DEFAULT.m, typer.Option("--hnsw-m", min=2, max=256, help="--ann hnsw: links per node")),
    ("ef_construction", int, _DEFAULT.ef_construction, typer.Option("--ef-construction", min=1, max=4096,
                                                                    help="--ann hnsw: graph breadth while building")),
    ("ef_search", int, _DEFAULT.ef_search, typer.Option("--ef-search", min=1, max=10_000,
                                                        help="--ann hnsw: the searches' default graph breadth (a request's ef_search "
                                         "overrides it)")),
    ("hnsw_codes", str, _DEFAULT.encoding, typer.Option("--hnsw-codes", callback=one_of(ENCODINGS),
                                                        help="--ann hnsw: how the graph stores vectors: sq8 "
                                                             "(1 byte a dim) or fp16 (2 bytes)")),
]


def with_first_stage_options(command):
    """Decorate a typer command taking ``first_stage: FirstStageOptions`` to expose the flags above."""
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                               annotation=Annotated[kind, option]) for name, kind, default, option in _FLAGS]
    return replace_parameter(command, "first_stage", added, lambda flags: _options(**flags))
