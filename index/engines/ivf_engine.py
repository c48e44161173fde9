"""The approximate CPU first stage by inverted lists: a Faiss IVF over compact codes, rescored from the exact rows.

The index (``first_stage.ivf.faiss``, written by ``index.building.ivf``) splits the rows into ``nlist``
lists by their nearest k-means centre and stores each row there as 8-bit (``sq8``) or float16
(``fp16``) scalar-quantized codes, with the row number as its id. A search ranks the centres by
inner product with the query and scans the codes of the ``nprobe`` best lists (Faiss's inner-product
metric throughout: a scan needs no distance, unlike a graph walk). It only finds candidates:
:class:`IvfStore` scores each query's ``depth`` best again exactly against ``values`` (the index's
one stored copy, that the rerank reads too), so every score a search reports is exact and only the
candidate set is approximate (a search reads at least ``MIN_RESCORED`` candidates). A filter that keeps
a query's lists markedly less than the rest (a filter keeping the rows least like the query) has its best
rows elsewhere: such a search scans the kept rows exactly. Any other filtered answer is checked against a
random draw of the kept rows (``hnsw_engine.checked``), and one a drawn row beats is replaced the same way. The list ids are rows at all times: a fold renumbers them in place
rather than keeping a map beside them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import numpy as np

from densehybrid.index.engines.faiss_engine import search as faiss_search
from densehybrid.index.engines.first_stage_record import FirstStageRecord
from densehybrid.index.engines.hnsw_engine import ENCODINGS, kept_exactly, rescore, searched_exactly, settled
from densehybrid.index.engines.host import HostRows
from densehybrid.index.errors import SearchError
from densehybrid.index.search.filters import Selection
from densehybrid.index.search.vector_store import VectorStore
from densehybrid.index.storage.files import IVF_LISTS

ANN_FILE = IVF_LISTS  # the file this engine reads (its name is the index layout's, ``index.storage.files``)
# the most lists a search may scan (a service setting bounds it further; above nlist it scans them all)
MAX_NPROBE = 65_536
# candidates read from the lists and rescored, at least: 8-bit codes misorder rows of close scores, and a
# scan costs the same whatever it keeps (at 1M x 768 rows, the exact top-10 came out of 10 candidates for
# 92% of queries, of 26 or more for all; rescoring 100 rows costs about 0.1 ms)
MIN_RESCORED = 100


@dataclass(frozen=True)
class IVFConfig(FirstStageRecord):
    """A Faiss IVF first stage: ``nlist`` k-means lists (0: :func:`lists_for` the rows) trained on
    ``train_size`` sampled rows, codes in ``encoding`` (``sq8`` or ``fp16``), ``nprobe`` lists scanned per
    query by default. ``trained_rows``: the rows when it was trained (set by the build; a fold retrains once
    the rows have doubled)."""

    nlist: int = 0
    nprobe: int = 16
    encoding: str = "sq8"
    train_size: int = 65_536
    seed: int = 1234
    trained_rows: int = 0

    def __post_init__(self):
        if self.encoding not in ENCODINGS:
            raise ValueError(f"unknown IVF encoding {self.encoding!r}; use one of {', '.join(ENCODINGS)}")
        if self.nlist < 0 or min(self.nprobe, self.train_size) < 1:
            raise ValueError("IVF nlist must be >= 0 (0: from the rows), nprobe and train_size >= 1")

    def to_dict(self) -> dict:
        """The manifest's ``first_stage`` entry."""
        return {"type": "ivf", "file": ANN_FILE, **asdict(self)}


# k-means needs tens of rows a list: Faiss warns below 39
MIN_ROWS_PER_LIST = 39


def lists_for(rows: int) -> int:
    """The number of lists for ``rows`` rows: the power of two nearest 4 sqrt(rows) (Faiss's guide puts it between
    4 and 16 sqrt(N)), with at least ``MIN_ROWS_PER_LIST`` rows a list."""
    wanted = 2 ** round(np.log2(max(1.0, 4 * np.sqrt(rows))))
    return int(max(1, min(wanted, rows // MIN_ROWS_PER_LIST)))


def is_ivf(first_stage: dict) -> bool:
    return first_stage.get("type") == "ivf"


def read_ivf(path: Path, count: int, dim: int, config: IVFConfig) -> faiss.Index:
    """The IVF file at ``path`` (codes memory-mapped); ValueError naming the problem when it is not ``count``
    vectors of ``dim`` in ``config.nlist`` lists."""
    try:
        # the codes are memory-mapped in place (zero copy; IO_FLAG_MMAP would read them through
        # OnDiskInvertedLists, about twice as slow a scan here)
        index = faiss.read_index(str(path), getattr(faiss, "IO_FLAG_MMAP_IFC", 0))
    except RuntimeError as exc:
        raise ValueError(f"not a readable Faiss index ({str(exc).splitlines()[0]})") from exc
    if not isinstance(index, faiss.IndexIVF):
        raise ValueError(f"holds a {type(index).__name__}, expected an IVF index")
    if index.ntotal != count or index.d != dim or index.nlist != config.nlist:
        raise ValueError(f"holds {index.ntotal} vectors of {index.d} dims in {index.nlist} lists, expected "
                         f"{count} of {dim} in {config.nlist}")
    return index


# a filtered search whose lists hold less than this share of the kept fraction is scanned exactly: a random
# filter keeps about its fraction of every list (within 1 % of it for 16 lists of 200 rows and half kept)
AVOIDED = 0.8


def list_of_rows(ivf: faiss.Index) -> np.ndarray:
    """(N,) int32: the list of each row (the lists' ids are the rows)."""
    out = np.zeros(ivf.ntotal, np.int32)
    for number in range(ivf.nlist):
        size = ivf.invlists.list_size(number)
        if size:
            out[faiss.rev_swig_ptr(ivf.invlists.get_ids(number), size)] = number
    return out


class IvfStore(HostRows, VectorStore):
    """IVF candidates, exact scores: ``ivf`` (an IndexIVF whose ids are the rows), values (N, dim) float16
    or float32, the stored copy memory-mapped, gates (N, G) uint8 or None; ``nprobe`` the lists scanned
    per query by default; ``flat`` the Faiss flat index of the stored copy, for the exact scans (None: numpy
    reads ``values``)."""

    first_stage = "ivf"

    def __init__(self, ivf: faiss.Index, values: np.ndarray, gates: np.ndarray | None, doc_ids, nprobe: int,
                 flat: faiss.Index | None = None):
        super().__init__(values, gates, doc_ids)
        self.ivf, self.nprobe, self.flat = ivf, nprobe, flat
        self._list_of_row = None  # (N,) the list of each row, read from the lists at the first filtered search

    def inner_product(self, xq: np.ndarray, depth: int, selection: Selection | None = None, *,
                      nprobe: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        if nprobe is not None and not 1 <= nprobe <= MAX_NPROBE:
            raise SearchError(f"nprobe must be in 1..{MAX_NPROBE}, got {nprobe}")
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        if searched_exactly(selection):
            return kept_exactly(xq, self.values, selection, depth, self.flat)
        probes, wanted = min(nprobe or self.nprobe, self.ivf.nlist), max(depth, MIN_RESCORED)
        rows = self._candidates(xq, wanted, probes, selection)
        # A filter's kept rows near a query are about as likely to sit in its nearest lists as the dropped
        # ones, so the same lists find its top rows (at 1M rows, random filters keeping 10 to 50 %: the
        # share of exact top-10s of the unfiltered search). Only queries whose lists came back short of
        # kept rows scan as many more lists as the filter keeps fewer.
        short = None if selection is None or probes == self.ivf.nlist else (rows < 0).any(axis=1)
        if short is not None and short.any():
            wider = min(self.ivf.nlist, int(np.ceil(probes / selection.fraction)))
            rows[short] = self._candidates(xq[short], wanted, wider, selection)
        scores, rows = rescore(xq, self.values, rows, depth)
        if selection is None:
            return scores, rows
        # a filter keeping the query's lists less than the rest has its best rows elsewhere
        return settled(xq, self.values, selection, (scores, rows), self._aside(xq, probes, selection), self.flat)

    def _aside(self, xq: np.ndarray, probes: int, selection: Selection) -> np.ndarray:
        """(Q,) whether the rows of a query's ``probes`` nearest lists are kept less than ``AVOIDED`` times as
        often as all rows are (a filter keeping the rows least like the query: a random filter keeps
        about the same share of every list)."""
        if self._list_of_row is None:
            self._list_of_row = list_of_rows(self.ivf)
        kept = np.bincount(self._list_of_row[selection.mask], minlength=self.ivf.nlist)
        sizes = np.bincount(self._list_of_row, minlength=self.ivf.nlist)
        lists = self.ivf.quantizer.search(xq, probes)[1]
        share = kept[lists].sum(axis=1) / np.maximum(1, sizes[lists].sum(axis=1))
        return share < AVOIDED * selection.fraction

    def _candidates(self, xq: np.ndarray, wanted: int, probes: int, selection: Selection | None) -> np.ndarray:
        """(Q, wanted) rows from the codes of each query's ``probes`` nearest lists, -1 where they hold fewer."""
        params = faiss.SearchParametersIVF(nprobe=probes)
        if selection is not None:
            bits = np.packbits(selection.mask, bitorder="little")
            params.sel = faiss.IDSelectorBitmap(len(selection.mask), faiss.swig_ptr(bits))  # bits outlive the search
        return faiss_search(self.ivf, xq, wanted, params)[1]
