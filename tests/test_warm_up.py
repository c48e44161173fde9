"""The start-up warm-up runs every stage of a search but reads a bounded part of the index.

A full exact scan at warm-up would page a whole memory-mapped index into memory before the first
request: ``row_limit`` restricts a search to the first rows (``filters.rows_below``), checked here
against numpy brute force for every first stage, and the warm-up's own search is checked to be so
restricted, for an exhaustive first stage, and unrestricted (a graph walk) for HNSW. The last test
counts the pages of ``vectors.faiss`` the warm-up brought into memory.
"""

import ctypes
import mmap
import os
from pathlib import Path

import faiss
import numpy as np
import pytest

from support.fake_encoder import FakeEncoder
from support.runtime import running, warmed_up
from densehybrid.encoder.base import Encoded
from densehybrid.index.building import build
from densehybrid.index.building.importing import ImportOptions, import_pyserini
from densehybrid.index.engines.hnsw_engine import HNSWConfig
from densehybrid.index.engines.pqscan_engine import PQScanConfig
from densehybrid.index.errors import SearchError
from densehybrid.index.search.filters import Selection, rows_below
from densehybrid.index.search.params import SearchParams
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.served.loading import load_index
from densehybrid.service import startup
from densehybrid.service.settings import ServiceSettings

DIM = 16


def _import(root: Path, count: int, dim: int = DIM, seed: int = 0, **options) -> Path:
    source = root / f"pyserini-{count}-{seed}"
    source.mkdir()
    flat = faiss.IndexFlatIP(dim)
    flat.add(np.random.default_rng(seed).standard_normal((count, dim), dtype=np.float32))
    faiss.write_index(flat, str(source / "index"))
    (source / "docid").write_text("".join(f"d{i}\n" for i in range(count)))
    return import_pyserini(source, root / f"ix-{count}-{seed}-{len(options)}", FakeEncoder("cls", dense_dim=dim).spec,
                           ImportOptions(**options))


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    root = tmp_path_factory.mktemp("warm")
    return {"flat": _import(root, 3000), "hnsw": _import(root, 3000, seed=2, ann=HNSWConfig(m=8, ef_construction=32)),
            "pqscan": _import(root, 3000, seed=3, ann=PQScanConfig(train_size=3000))}


def test_rows_below_is_a_prefix_mask_within_a_filter():
    got = rows_below(4, 10)
    np.testing.assert_array_equal(got.mask, np.arange(10) < 4)
    assert (got.count, got.total, got.expression) == (4, 10, "row < 4")
    kept = np.array([True, False] * 5)
    both = rows_below(5, 10, Selection(5, 10, mask=kept))
    np.testing.assert_array_equal(both.mask, kept & (np.arange(10) < 5))
    assert both.count == 3
    remote = rows_below(5, 10, Selection(7, 10, expression='f_lang == "en"'))
    assert (remote.count, remote.expression, remote.mask) == (5, '(f_lang == "en") and row < 5', None)
    assert rows_below(20, 10).everything


@pytest.mark.parametrize("kind,engine", [("flat", None), ("flat", "torch"), ("pqscan", None), ("hnsw", None)])
def test_a_row_limited_search_is_the_top_of_those_rows(indexes, kind, engine):
    index = load_index(indexes[kind])
    searcher = Searcher(index, engine=engine)
    xq = np.random.default_rng(5).standard_normal((3, DIM)).astype(np.float32)
    found = searcher.search(Encoded(xq, None), SearchParams(k=10, row_limit=700))
    assert all(0 <= r < 700 for rows in found.rows for r in rows) and all(len(r) == 10 for r in found.rows)
    # exact first stages (and the approximate ones' exact scan of few kept rows): brute force
    scores = xq @ np.asarray(index.values[:700], np.float32).T
    want = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    for q in range(3):
        got = np.asarray(found.scores[q])
        np.testing.assert_allclose(got, scores[q, want[q]], rtol=1e-3, atol=1e-3)  # float16 ties may swap rows
    with pytest.raises(SearchError, match="row_limit"):
        searcher.search(Encoded(xq, None), SearchParams(row_limit=0))


def _warm_up_selections(index_dir: Path, encoder=None) -> list:
    """The selections the warm-up's first stage was given (None: the whole index)."""
    rt = startup.build_runtime(ServiceSettings(), encoder or FakeEncoder("cls", dense_dim=DIM),
                               load_index(index_dir))
    store = rt.index._state.searcher.store  # the live index's current searcher
    seen, first_stage = [], store.inner_product

    def recording(xq, depth, selection=None, **extra):
        seen.append(selection)
        return first_stage(xq, depth, selection, **extra)

    store.inner_product = recording
    warmed_up(rt)
    return seen


def test_the_warm_up_scans_the_first_rows_only(indexes):
    (selection,) = _warm_up_selections(indexes["flat"])
    assert selection.count == startup.WARMUP_ROWS < 3000
    assert selection.mask[:startup.WARMUP_ROWS].all() and not selection.mask[startup.WARMUP_ROWS:].any()


def test_the_warm_up_walks_a_graph_unrestricted(indexes):
    assert _warm_up_selections(indexes["hnsw"]) == [None]  # a walk reads about ef_search rows anyway


def test_the_warm_up_scans_product_codes_unrestricted(indexes):
    assert _warm_up_selections(indexes["pqscan"]) == [None]  # the codes are in memory; it rescores about rescore rows


def test_a_tiny_index_warms_up_over_all_its_rows(tmp_path):
    assert _warm_up_selections(_import(tmp_path, 12)) == [None]


def test_an_empty_index_warms_up_and_is_ready(tmp_path):
    encoder = FakeEncoder("cls", dense_dim=DIM)
    empty = build.build_from_arrays(tmp_path / "empty", encoder.spec, Encoded(np.zeros((0, DIM), np.float32), None), [])
    assert _warm_up_selections(empty, encoder) == []  # nothing to scan; the search answers no hit, then ready


def _resident_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache now (mincore over a private map of it)."""
    size, page = path.stat().st_size, mmap.PAGESIZE
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        pages = (size + page - 1) // page
        flags = (ctypes.c_ubyte * pages)()
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), flags) != 0:
            pytest.skip(f"mincore failed: errno {ctypes.get_errno()}")
        del address
        return sum(f & 1 for f in flags) * page


def test_the_warm_up_pages_in_a_small_part_of_the_vectors(tmp_path):
    index_dir = _import(tmp_path, 200_000, dim=64)  # 25.6 MB of float16 rows
    vectors = index_dir / "vectors.faiss"
    with open(vectors, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if _resident_bytes(vectors) > vectors.stat().st_size // 4:
        pytest.skip("this file system keeps files in memory (tmpfs): nothing to page in")
    rt = startup.build_runtime(ServiceSettings(), FakeEncoder("cls", dense_dim=64), load_index(index_dir))
    with running(rt):
        startup.warm_up(rt)
        warmed = _resident_bytes(vectors)
        xq = np.ones((1, 64), np.float32)
        rt.index.search(Encoded(xq, None), SearchParams(k=10))  # a request's full scan, for contrast
        scanned = _resident_bytes(vectors)
    assert warmed < vectors.stat().st_size // 20, (warmed, scanned)
    assert scanned > vectors.stat().st_size // 2, (warmed, scanned)
