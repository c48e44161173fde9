"""The first-stage flags of the commands that write an index (``index build``, and any import of vectors).

``--ann flat`` (the default) keeps the exact scan, or ``IndexPQ`` with ``--pq M``; ``--ann hnsw``
writes a Faiss HNSW graph beside the exact rows, and ``--ann ivf`` Faiss inverted lists, either
searched first and rescored exactly::

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
from densehybrid.index.building.first_stage import AnnConfig
from densehybrid.index.engines.hnsw_engine import ENCODINGS, HNSWConfig
from densehybrid.index.engines.ivf_engine import IVFConfig

ANN_CHOICES = ("flat", "hnsw", "ivf")
_DEFAULT = HNSWConfig()
_DEFAULT_IVF = IVFConfig()


@dataclass(frozen=True)
class FirstStageOptions:
    """At most one of ``pq`` and ``ann`` (None, None: the exact flat scan)."""

    pq: PQConfig | None = None
    ann: AnnConfig | None = None


def _options(ann: str, pq_m: int, pq_nbits: int, hnsw_m: int, ef_construction: int, ef_search: int,
             hnsw_codes: str, ivf_lists: int, ivf_codes: str, nprobe: int) -> FirstStageOptions:
    if ann == "flat":
        return FirstStageOptions(pq=PQConfig(pq_m, pq_nbits) if pq_m else None)
    if pq_m:
        raise typer.BadParameter("--pq is a first stage of its own: use it with --ann flat, or leave it out "
                                 f"for --ann {ann}", param_hint="--pq")
    if ann == "ivf":
        return FirstStageOptions(ann=IVFConfig(nlist=ivf_lists, nprobe=nprobe, encoding=ivf_codes))
    return FirstStageOptions(ann=HNSWConfig(m=hnsw_m, ef_construction=ef_construction, ef_search=ef_search,
                                            encoding=hnsw_codes))


_FLAGS = [  # (parameter, type, default, flag)
    ("ann", str, "flat", typer.Option("--ann", callback=one_of(ANN_CHOICES),
                                      help="first stage: flat (exact scan, or IndexPQ with --pq), hnsw "
                                           "(a Faiss HNSW graph) or ivf (Faiss inverted lists); the candidates of "
                                           "hnsw and ivf are rescored exactly")),
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
    ("ivf_lists", int, _DEFAULT_IVF.nlist, typer.Option("--ivf-lists", min=1, max=1 << 20,
                                                       help="--ann ivf: k-means lists the rows are split into")),
    ("ivf_codes", str, _DEFAULT_IVF.encoding, typer.Option("--ivf-codes", callback=one_of(ENCODINGS),
                                                         help="--ann ivf: how the lists store vectors: sq8 "
                                                              "(1 byte a dim) or fp16 (2 bytes)")),
    ("nprobe", int, _DEFAULT_IVF.nprobe, typer.Option("--nprobe", min=1, max=65_536,
                                                     help="--ann ivf: the searches' default lists scanned per query "
                                                          "(a request's nprobe overrides it)")),
]


def with_first_stage_options(command):
    """Decorate a typer command taking ``first_stage: FirstStageOptions`` to expose the flags above."""
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                               annotation=Annotated[kind, option]) for name, kind, default, option in _FLAGS]
    return replace_parameter(command, "first_stage", added, lambda flags: _options(**flags))
